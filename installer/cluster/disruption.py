"""PodDisruptionBudgets, checked by the installer before it deletes a pod the way the Eviction API
checks them. The installer drains its node through DELETE because the admission policy can limit
a DELETE to the pods of the token's own node (the request carries the pod); an Eviction names a
pod but not its node, so a token allowed to create Evictions could evict any pod in the cluster.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from installer.cluster.client import Json, NodeClient


class Verdict(NamedTuple):
    """Whether a pod may be deleted now: `blocked` says why not (None: it may); `budget` is the
    budget the deletion takes a disruption from (None: no budget is charged)."""

    blocked: str | None
    budget: Json | None = None


class Budgets:
    """The budgets of the namespaces one drain meets, read once per pass, and the disruptions this
    drain has taken from each since the disruption controller last wrote its status (the Eviction
    API takes them off the status itself; a DELETE does not, so until the controller's next
    status a second pod of the same budget would be judged on the first one's allowance)."""

    def __init__(self, api: NodeClient) -> None:
        self._api = api
        self._listed: dict[str, list[Json]] = {}
        self._taken: dict[str, tuple[str, int]] = {}  # uid -> (resourceVersion, disruptions)

    def new_pass(self) -> None:
        """Read the budgets again (their status moves as pods leave and come back)."""
        self._listed.clear()

    def verdict(self, pod: Json) -> Verdict:
        """As pkg/registry/core/pod/storage/eviction.go decides: a pending or terminating pod
        goes without a check; more than one budget selecting the pod refuses it (the Eviction
        API answers 500); a budget whose status is older than its spec, or that allows no
        disruption, blocks it (the Eviction API's 429); an unready pod goes when its budget is
        healthy enough (unhealthyPodEvictionPolicy IfHealthyBudget) or always (AlwaysAllow).
        Raises ClusterApi* errors."""
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Pending", "Succeeded", "Failed") or \
                meta.get("deletionTimestamp"):
            return Verdict(None)
        namespace = str(meta.get("namespace", "default"))
        if namespace not in self._listed:
            self._listed[namespace] = self._api.pod_disruption_budgets(namespace)
        labels = meta.get("labels") or {}
        budgets = [b for b in self._listed[namespace]
                   if selects((b.get("spec") or {}).get("selector"), labels)]
        if not budgets:
            return Verdict(None)
        if len(budgets) > 1:
            names = ", ".join(sorted(_name(b) for b in budgets))
            return Verdict(f"more than one PodDisruptionBudget selects it ({names}), which the "
                           "Eviction API refuses too")
        budget = budgets[0]
        status = budget.get("status") or {}
        name = f"PodDisruptionBudget {namespace}/{_name(budget)}"
        if _int(status.get("observedGeneration")) < _int(
                (budget.get("metadata") or {}).get("generation")):
            return Verdict(f"{name} is still being processed by the disruption controller")
        healthy, desired = _int(status.get("currentHealthy")), _int(status.get("desiredHealthy"))
        if not _ready(pod):
            policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy")
            if policy == "AlwaysAllow" or (healthy >= desired > 0):
                return Verdict(None)
        allowed = _int(status.get("disruptionsAllowed")) - self._taken_from(budget)
        if allowed <= 0:
            return Verdict(f"{name} allows no disruption now (it needs {desired} healthy "
                           f"pods and has {healthy})", budget)
        return Verdict(None, budget)

    def charge(self, budget: Json | None) -> None:
        """A pod under `budget` was deleted: one disruption fewer until its status is new."""
        if budget is None:
            return
        meta = budget.get("metadata") or {}
        uid, version = str(meta.get("uid", _name(budget))), str(meta.get("resourceVersion"))
        seen, taken = self._taken.get(uid, (version, 0))
        self._taken[uid] = (version, (taken if seen == version else 0) + 1)

    def _taken_from(self, budget: Json) -> int:
        meta = budget.get("metadata") or {}
        seen, taken = self._taken.get(str(meta.get("uid", _name(budget))), ("", 0))
        return taken if seen == str(meta.get("resourceVersion")) else 0


def selects(selector: Any, labels: dict[str, str]) -> bool:
    """policy/v1 selector semantics: a null selector selects no pod, an empty one ({}) every pod
    of the namespace; matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist). A
    selector the API server could not have accepted selects nothing, as the Eviction API skips
    a budget whose selector it cannot parse."""
    if not isinstance(selector, dict):
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or []
        if operator == "In":
            matched = key in labels and labels[key] in values
        elif operator == "NotIn":
            matched = key not in labels or labels[key] not in values
        elif operator == "Exists":
            matched = key in labels
        elif operator == "DoesNotExist":
            matched = key not in labels
        else:
            return False
        if not matched:
            return False
    return True


def _ready(pod: Json) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _name(budget: Json) -> str:
    return str((budget.get("metadata") or {}).get("name", "?"))


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
