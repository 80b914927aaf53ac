"""A stand-in Kubernetes API server on 127.0.0.1 with only the endpoints the installer calls.

Semantics follow the API reference (kubernetes.io/docs/reference/kubernetes-api):
- PATCH /api/v1/nodes/{name}/status: strategic merge patch (conditions merged by type) or JSON
  merge patch; spec changes dropped as the status strategy drops them; managedFields name the
  field manager of each condition written.
- PATCH /api/v1/nodes/{name} with application/apply-patch+yaml (server-side apply; the body as
  JSON, YAML's subset) of metadata.labels and metadata.annotations only: `fieldManager`
  required (422); the keys sent are owned by that manager (its managedFields entry, operation
  Apply); a key it owned and no longer sends is removed unless another manager owns it too; a
  key another manager owns with another value is a 409 conflict unless `force=true`, which
  takes it over; the same value is shared. A merge patch that sets a label or annotation makes
  its manager the key's only owner (operation Update); one that removes it leaves it no owner.
  The node must exist (no apply-create).
- GET/PATCH /api/v1/nodes/{name}: JSON merge patch (RFC 7386); a patch carrying
  metadata.resourceVersion that is not the current one is refused with 409 Conflict; a no-op patch
  leaves resourceVersion alone; label values are validated (422 Invalid).
- GET /api/v1/nodes?labelSelector=...: equality-based selectors (`key`, `key=value`,
  `key!=value`, comma-joined), as kube-apiserver filters a NodeList.
- GET /api/v1/pods?fieldSelector=spec.nodeName=<n>: only that field selector (others: 400).
- POST /api/v1/namespaces/{ns}/pods/{name}/eviction: policy/v1 Eviction. Terminating, terminal
  and pending pods are evicted without a PodDisruptionBudget check; with one matching budget whose
  disruptions allowed is 0 the answer is 429 TooManyRequests; two budgets: 500. (The shipped
  RBAC grants no `create` on pods/eviction: a token that tries gets the 403.)
- DELETE /api/v1/namespaces/{ns}/pods/{name}: graceful (the pod's own grace period), or at once
  with gracePeriodSeconds=0 (query or DeleteOptions body); DeleteOptions.preconditions.uid and
  .resourceVersion that do not match the pod: 409 Conflict ("Precondition failed").
- GET /apis/policy/v1/namespaces/{ns}/poddisruptionbudgets: a PodDisruptionBudgetList whose
  status is what the disruption controller writes (expectedPods, currentHealthy, desiredHealthy
  from minAvailable or maxUnavailable, integers or percentages rounded up, disruptionsAllowed,
  observedGeneration), recomputed on every read (a controller that never lags) with the
  resourceVersion bumped when it changes. Selectors: matchLabels and matchExpressions (In, NotIn,
  Exists, DoesNotExist); policy/v1: a null selector selects no pod, an empty one every pod of the
  namespace.
- GET /apis/resource.k8s.io: the group's discovery (APIGroup), listing only the versions of
  Cluster.resource_versions (Kubernetes 1.32/1.33 serve v1beta1/v1beta2, 1.34 adds v1); none:
  404, as a cluster without DRA answers. An unserved version's path is a plain-text 404.
- GET /apis/resource.k8s.io/{version}/namespaces/{ns}/resourceclaims[/{name}] and
  /apis/resource.k8s.io/{version}/resourceclaims: ResourceClaims as the scheduler leaves them
  (status.allocation.devices.results[].driver, status.reservedFor the pod), named by the pod
  in spec.resourceClaims or, from a template, in status.resourceClaimStatuses.
- POST /api/v1/namespaces/{ns}/events: core/v1 Event; for a Node the namespace must be default.
- POST /apis/authentication.k8s.io/v1/tokenreviews: authentication.k8s.io/v1 TokenReview of
  spec.token: status.authenticated and status.user (username, uid, groups, extra) for a token
  of Cluster.client_tokens (or the installer's own), else status.error with authenticated
  left out, as the API server answers an unknown token; 201 either way.
- POST /apis/authorization.k8s.io/v1/subjectaccessreviews: authorization.k8s.io/v1
  SubjectAccessReview; exactly one of spec.resourceAttributes and spec.nonResourceAttributes
  (else 422), a user or a group (else 422); status.allowed from Cluster.url_grants for a
  non-resource URL (RBAC's nonResourceURLs: a trailing * is a prefix, verb * any verb).
- Bearer-token authentication (401) and, when given, the rules of a ClusterRole (403).
- When given, ValidatingAdmissionPolicies (their CEL run by cluster.admission, its
  `authorizer` answering from the same ClusterRole rules) on every write, with the token's
  userInfo as the API server builds it for a pod-bound ServiceAccount token (the node claim in
  `extra`): a denial is 403 `... is forbidden: ValidatingAdmissionPolicy
  ... denied request: ...`. managedFields for spec.unschedulable: the field manager that last
  changed it (`fieldManager`, else the User-Agent's product, as the API server derives it).

The kubelet's part: a pod with a deletionTimestamp goes away after its grace period unless it has
finalizers (then it stays, as a pod stuck terminating does). `on_node_change` callbacks play the
DaemonSet controller and kubelet reacting to node labels.

Run alone: python3 -m cluster.apiserver --seed seed.json --port-file F [--role rbac.yaml]
                                        [--policy admission-policy.yaml]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import re
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

from lib.httpfaults import QuietHandler

Json = dict[str, Any]
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Optional[Json] = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Request:
    method: str
    path: str
    query: str
    status: int
    body: Any = None  # the request's JSON body (a DELETE's DeleteOptions)

    @property
    def is_write(self) -> bool:
        return self.method in ("POST", "PATCH", "PUT", "DELETE") and self.status < 400


@dataclass
class Cluster:
    """The stored objects; every method holds the lock."""

    # None: clients prove who they are with a client certificate (ApiServer's tls)
    token: Optional[str] = "stand-in-token"
    rules: Optional[list[Json]] = None  # a ClusterRole's rules; None: everything allowed
    # bound ValidatingAdmissionPolicies (cluster.admission.load_policies) and the node
    # claim of the token (None: a token without one, such as a long-lived Secret token)
    policies: Optional[list[tuple[Json, str]]] = None
    token_node: Optional[str] = None
    username: str = "system:serviceaccount:kube-system:nvidia-driver-installer"
    grace_seconds: float = 0.3
    nodes: dict[str, Json] = field(default_factory=dict)
    pods: dict[tuple[str, str], Json] = field(default_factory=dict)
    pdbs: list[Json] = field(default_factory=list)
    claims: dict[tuple[str, str], Json] = field(default_factory=dict)
    # resource.k8s.io versions served, preferred first (status.allocation is the same in each)
    resource_versions: tuple[str, ...] = ("v1",)
    events: list[Json] = field(default_factory=list)
    # Other clients' bearer tokens (a Prometheus's) -> the user a TokenReview names for them
    client_tokens: dict[str, Json] = field(default_factory=dict)
    # (user or group, verb, non-resource URL) that a bound ClusterRole grants
    url_grants: set[tuple[str, str, str]] = field(default_factory=set)
    requests: list[Request] = field(default_factory=list)
    on_node_change: list[Callable[[Cluster, Json], None]] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    _rv: int = 1000

    def next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # --- seeding (what a test or a controller does) ---

    def add_node(self, name: str, labels: Optional[dict[str, str]] = None,
                 unschedulable: bool = False) -> Json:
        with self.lock:
            node: Json = {"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "uid": str(uuid.uuid4()),
                                       "resourceVersion": self.next_rv(),
                                       "labels": dict(labels or {}), "annotations": {}},
                          "spec": {}}
            if unschedulable:
                node["spec"]["unschedulable"] = True
            self.nodes[name] = node
            return node

    def add_pod(self, namespace: str, name: str, node: str, *, gpus: int = 0,
                labels: Optional[dict[str, str]] = None, ready: bool = True,
                finalizers: Optional[list[str]] = None, owner_kind: Optional[str] = None,
                annotations: Optional[dict[str, str]] = None,
                tolerations: Optional[list[Json]] = None) -> Json:
        with self.lock:
            resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
            pod: Json = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                             "resourceVersion": self.next_rv(), "labels": dict(labels or {})},
                "spec": {"nodeName": node,
                         "containers": [{"name": "main", "image": "cuda",
                                         "resources": resources}]},
                "status": {"phase": "Running",
                           "conditions": [{"type": "Ready",
                                           "status": "True" if ready else "False"}]},
            }
            if finalizers:
                pod["metadata"]["finalizers"] = list(finalizers)
            if owner_kind:
                pod["metadata"]["ownerReferences"] = [{
                    "apiVersion": "apps/v1", "kind": owner_kind, "name": f"{name}-owner",
                    "uid": str(uuid.uuid4()), "controller": True, "blockOwnerDeletion": True}]
            if annotations:
                pod["metadata"]["annotations"] = dict(annotations)
            if tolerations:
                pod["spec"]["tolerations"] = list(tolerations)
            self.pods[(namespace, name)] = pod
            return pod

    def add_pdb(self, namespace: str, name: str, selector: Optional[dict[str, str]], *,
                min_available: Optional[Any] = None, max_unavailable: Optional[Any] = None,
                expressions: Optional[list[Json]] = None,
                unhealthy_policy: Optional[str] = None) -> Json:
        """A PodDisruptionBudget; `selector` None with no `expressions`: a null selector."""
        spec: Json = {}
        if selector is not None or expressions is not None:
            spec["selector"] = {}
            if selector:
                spec["selector"]["matchLabels"] = dict(selector)
            if expressions:
                spec["selector"]["matchExpressions"] = list(expressions)
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        if unhealthy_policy is not None:
            spec["unhealthyPodEvictionPolicy"] = unhealthy_policy
        with self.lock:
            pdb: Json = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                         "metadata": {"name": name, "namespace": namespace,
                                      "uid": str(uuid.uuid4()), "generation": 1,
                                      "resourceVersion": self.next_rv()},
                         "spec": spec}
            self.pdbs.append(pdb)
            self._pdb_status(pdb)
            return pdb

    def add_claim(self, namespace: str, name: str, pod: Json, driver: Optional[str], *,
                  template: Optional[str] = None) -> Json:
        """A resource.k8s.io/v1 ResourceClaim of `pod` as the scheduler leaves it: allocated
        by `driver` (None: still pending) and reserved for the pod; the pod names it in
        spec.resourceClaims (directly, or through `template`, when the claim's name is only in
        status.resourceClaimStatuses, as the resourceclaim controller generates it)."""
        with self.lock:
            claim: Json = {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                             "resourceVersion": self.next_rv()},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                    "count": 1}}]}},
                "status": {},
            }
            if driver is not None:
                claim["status"] = {
                    "allocation": {"devices": {"results": [{
                        "request": "gpu", "driver": driver, "pool": pod["spec"]["nodeName"],
                        "device": "gpu-0"}]},
                        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                            "key": "metadata.name", "operator": "In",
                            "values": [pod["spec"]["nodeName"]]}]}]}},
                    "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"],
                                     "uid": pod["metadata"]["uid"]}]}
            self.claims[(namespace, name)] = claim
            stored = self.pods[(namespace, pod["metadata"]["name"])]
            entry = f"claim-{len(stored['spec'].get('resourceClaims') or [])}"
            if template is None:
                stored["spec"].setdefault("resourceClaims", []).append(
                    {"name": entry, "resourceClaimName": name})
            else:
                stored["spec"].setdefault("resourceClaims", []).append(
                    {"name": entry, "resourceClaimTemplateName": template})
                stored["status"].setdefault("resourceClaimStatuses", []).append(
                    {"name": entry, "resourceClaimName": name})
            return claim

    def node(self, name: str) -> Json:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def writes(self) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.is_write]

    def remove_finalizers(self, namespace: str, name: str) -> None:
        with self.lock:
            self.pods[(namespace, name)]["metadata"].pop("finalizers", None)

    # --- the kubelet and the disruption controller ---

    def kubelet(self) -> None:
        """Pods whose grace period ran out are gone, unless finalizers hold them."""
        with self.lock:
            now = time.monotonic()
            for key, pod in list(self.pods.items()):
                deadline = pod.get("_deleteAt")
                if deadline is not None and now >= deadline and not pod["metadata"].get(
                        "finalizers"):
                    del self.pods[key]

    def _start_deletion(self, pod: Json, grace: Optional[float]) -> None:
        grace = self.grace_seconds if grace is None else grace
        pod["metadata"].setdefault("deletionTimestamp", _now())
        pod["metadata"]["deletionGracePeriodSeconds"] = int(grace)
        pod["metadata"]["resourceVersion"] = self.next_rv()
        pod["_deleteAt"] = min(pod.get("_deleteAt", float("inf")), time.monotonic() + grace)
        self.kubelet()

    def _matches(self, selector: Optional[Json], pod: Json) -> bool:
        """policy/v1 selector semantics: null selects nothing, {} everything."""
        if selector is None:
            return False
        labels = pod["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
            return False
        for expression in selector.get("matchExpressions") or []:
            key, operator = expression["key"], expression["operator"]
            present, value = key in labels, labels.get(key)
            values = expression.get("values") or []
            if not {"In": present and value in values,
                    "NotIn": not present or value not in values,
                    "Exists": present, "DoesNotExist": not present}[operator]:
                return False
        return True

    @staticmethod
    def _ready(pod: Json) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in pod["status"]["conditions"])

    def _pdb_status(self, pdb: Json) -> Json:
        """The disruption controller's status for the budget (its resourceVersion bumped when
        the status changes, as the controller's update does)."""
        ns = pdb["metadata"]["namespace"]
        selected = [p for (pns, _), p in self.pods.items()
                    if pns == ns and self._matches(pdb["spec"].get("selector"), p)]
        healthy = sum(1 for p in selected
                      if not p["metadata"].get("deletionTimestamp") and self._ready(p))
        spec, expected = pdb["spec"], len(selected)

        def scaled(value: Any) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return -(-int(value[:-1]) * expected // 100)  # rounded up, as the controller
            return int(value)

        if "minAvailable" in spec:
            desired = scaled(spec["minAvailable"])
        else:
            desired = max(0, expected - scaled(spec.get("maxUnavailable", 0)))
        status = {"observedGeneration": pdb["metadata"]["generation"],
                  "disruptionsAllowed": max(0, healthy - desired), "currentHealthy": healthy,
                  "desiredHealthy": desired, "expectedPods": expected}
        if pdb.get("status") != status:
            pdb["status"] = status
            pdb["metadata"]["resourceVersion"] = self.next_rv()
        return status

    def _disruptions_allowed(self, pdb: Json) -> int:
        return int(self._pdb_status(pdb)["disruptionsAllowed"])

    # --- the endpoints ---

    def get_node(self, name: str) -> Json:
        if name not in self.nodes:
            raise ApiError(404, "NotFound", f'nodes "{name}" not found',
                           {"name": name, "kind": "nodes"})
        return _public(self.nodes[name])

    def apply_node(self, name: str, body: Any, manager: str, force: bool) -> Json:
        """Server-side apply of a node's labels and annotations (see the module's docstring)."""
        node = self.nodes.get(name)
        if node is None:
            self.get_node(name)
        if not manager:
            raise ApiError(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: "
                           "fieldManager: Required value: is required for apply patch")
        if not isinstance(body, dict) or body.get("apiVersion") != "v1" or \
                body.get("kind") != "Node":
            raise ApiError(400, "BadRequest", "an apply patch of a node must name apiVersion v1 "
                           "and kind Node")
        meta = body.get("metadata") or {}
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", f"the name of the object ({meta.get('name')}) "
                           f"does not match the name on the URL ({name})")
        if set(body) - {"apiVersion", "kind", "metadata"} or \
                set(meta) - {"name", "labels", "annotations"}:
            raise ApiError(415, "UnsupportedMediaType", "the stand-in applies only "
                           "metadata.labels and metadata.annotations of a node")
        sent = {kind: dict(meta.get(kind) or {}) for kind in ("labels", "annotations")}
        for value in sent["labels"].values():
            if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
                raise ApiError(422, "Invalid", f"Node \"{name}\" is invalid: metadata.labels: "
                               f"Invalid value: {value!r}")
        entries = copy.deepcopy(node["metadata"].get("managedFields") or [])
        mine = [e for e in entries if e["manager"] == manager and e["operation"] == "Apply"]
        others = [e for e in entries if not (e["manager"] == manager and
                                            e["operation"] == "Apply")]
        had = {kind: set().union(*(_owned_keys(e, kind) for e in mine))
               for kind in ("labels", "annotations")}
        new = copy.deepcopy(node)
        conflicts = []
        for kind, values in sent.items():
            current = node["metadata"].get(kind) or {}
            for key, value in values.items():
                if key in current and current[key] != value:
                    for entry in others:
                        if key in _owned_keys(entry, kind):
                            conflicts.append((entry, kind, key))
        if conflicts and not force:
            lines = [f'conflict with "{e["manager"]}": .metadata.{kind}.{key}'
                     for e, kind, key in conflicts]
            raise ApiError(409, "Conflict", f"Apply failed with {len(lines)} conflict"
                           f"{'s' if len(lines) > 1 else ''}: " + "; ".join(lines),
                           {"name": name, "kind": "nodes"})
        for entry, kind, key in conflicts:  # forced: the applier takes them over
            _disown(entry, kind, key)
        others = [e for e in others if e["fieldsV1"]]
        for kind, values in sent.items():
            target = new["metadata"].setdefault(kind, {})
            target.update(values)
            for key in had[kind] - set(values):
                if not any(key in _owned_keys(e, kind) for e in others):
                    target.pop(key, None)
        fields = {f"f:{kind}": {f"f:{key}": {} for key in values}
                  for kind, values in sent.items() if values}
        if fields:
            others.append({"manager": manager, "operation": "Apply", "apiVersion": "v1",
                           "time": _now(), "fieldsType": "FieldsV1",
                           "fieldsV1": {"f:metadata": fields}})
        new["metadata"]["managedFields"] = others
        if _without_times(new) != _without_times(node):
            self.admit("UPDATE", "nodes", name, obj=new, old=node)
            new["metadata"]["resourceVersion"] = self.next_rv()
            self.nodes[name] = new
            for callback in self.on_node_change:
                callback(self, copy.deepcopy(new))
        return _public(self.nodes[name])

    def patch_node(self, name: str, content_type: str, patch: Any, manager: str = "") -> Json:
        if content_type != "application/merge-patch+json":
            raise ApiError(415, "UnsupportedMediaType",
                           f"the stand-in implements merge patches only, not {content_type}")
        node = self.nodes.get(name)
        if node is None:
            self.get_node(name)
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch of a node must be an object")
        wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != node["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": '
                           "the object has been modified; please apply your changes to the "
                           "latest version and try again", {"name": name, "kind": "nodes"})
        merged = merge_patch(node, patch)
        merged["metadata"]["resourceVersion"] = node["metadata"]["resourceVersion"]
        for _key, value in (merged["metadata"].get("labels") or {}).items():
            if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
                raise ApiError(422, "Invalid", f"Node \"{name}\" is invalid: metadata.labels: "
                               f"Invalid value: {value!r}")
        unschedulable = (merged.get("spec") or {}).get("unschedulable")
        if unschedulable is not None and not isinstance(unschedulable, bool):
            raise ApiError(400, "BadRequest", "spec.unschedulable must be a boolean")
        if merged != node:
            _take_labels(merged, node, manager)
            self.admit("UPDATE", "nodes", name, obj=merged, old=node)
            if (merged.get("spec") or {}).get("unschedulable") != (
                    node.get("spec") or {}).get("unschedulable"):
                _own_unschedulable(merged, manager, bool(merged["spec"].get("unschedulable")))
            merged["metadata"]["resourceVersion"] = self.next_rv()
            self.nodes[name] = merged
            for callback in self.on_node_change:
                callback(self, copy.deepcopy(merged))
        return _public(self.nodes[name])

    def patch_node_status(self, name: str, content_type: str, patch: Any,
                          manager: str = "") -> Json:
        """PATCH nodes/{name}/status: a strategic merge patch (status.conditions merged by
        `type`, as the Node type's patchMergeKey says) or a JSON merge patch (the list replaced
        whole). As the node status strategy does, a change to spec is dropped; the policies
        then see the object that would be stored."""
        if content_type not in ("application/strategic-merge-patch+json",
                                "application/merge-patch+json"):
            raise ApiError(415, "UnsupportedMediaType", f"the media type {content_type!r} is "
                           "not supported for nodes/status")
        node = self.nodes.get(name)
        if node is None:
            self.get_node(name)
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a patch of a node's status must be an object")
        status_patch = patch.get("status")
        conditions = None
        if content_type.startswith("application/strategic") and isinstance(status_patch, dict) \
                and isinstance(status_patch.get("conditions"), list):
            status_patch = dict(status_patch)
            conditions = _merge_by_type((node.get("status") or {}).get("conditions") or [],
                                        status_patch.pop("conditions"))
        merged = merge_patch(node, {**patch, "status": status_patch}
                             if "status" in patch else patch)
        if conditions is not None:
            merged.setdefault("status", {})["conditions"] = conditions
        merged["spec"] = copy.deepcopy(node.get("spec") or {})
        merged["metadata"]["resourceVersion"] = node["metadata"]["resourceVersion"]
        for condition in (merged.get("status") or {}).get("conditions") or []:
            if not isinstance(condition, dict) or not condition.get("type") or \
                    condition.get("status") not in ("True", "False", "Unknown"):
                raise ApiError(422, "Invalid", f'Node "{name}" is invalid: status.conditions: '
                               f"Invalid value: {condition!r}")
        if merged != node:
            self.admit("UPDATE", "nodes", name, subresource="status", obj=merged, old=node)
            for condition in (patch.get("status") or {}).get("conditions") or []:
                _own_condition(merged, manager, str(condition.get("type")))
            merged["metadata"]["resourceVersion"] = self.next_rv()
            self.nodes[name] = merged
        return _public(self.nodes[name])

    def list_nodes(self, query: dict[str, list[str]]) -> Json:
        """Nodes by label selector: `key` (exists), `key=value` and `key!=value` terms joined
        by commas, as kube-apiserver's equality-based selectors."""
        terms = [t for s in query.get("labelSelector", []) for t in s.split(",") if t]
        parsed = []
        for term in terms:
            match = re.fullmatch(r"([A-Za-z0-9./_-]+)(?:(!=|==|=)([A-Za-z0-9._-]*))?", term)
            if not match:
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
            parsed.append(match.groups())

        def picked(labels: dict[str, str]) -> bool:
            for key, op, value in parsed:
                if op is None and key not in labels:
                    return False
                if op in ("=", "==") and labels.get(key) != value:
                    return False
                if op == "!=" and labels.get(key) == value:
                    return False
            return True

        items = [_public(n) for n in self.nodes.values()
                 if picked(n["metadata"].get("labels") or {})]
        return {"apiVersion": "v1", "kind": "NodeList",
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def list_pods(self, query: dict[str, list[str]]) -> Json:
        self.kubelet()
        selectors = query.get("fieldSelector", [])
        node = None
        for selector in selectors:
            match = re.fullmatch(r"spec\.nodeName=([^,]*)", selector)
            if not match:
                raise ApiError(400, "BadRequest",
                               f"the stand-in supports only the spec.nodeName field selector, "
                               f"not {selector!r}")
            node = match.group(1)
        items = [_public(p) for p in self.pods.values()
                 if node is None or p["spec"].get("nodeName") == node]
        return {"apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def evict(self, namespace: str, name: str, body: Any) -> Json:
        self.kubelet()
        if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
            raise ApiError(400, "BadRequest", "the body must be an Eviction")
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction")
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found',
                           {"name": name, "kind": "pods"})
        phase = pod["status"].get("phase")
        if pod["metadata"].get("deletionTimestamp") or phase in ("Succeeded", "Failed",
                                                                  "Pending"):
            self._start_deletion(pod, None)
            return _success(201)
        pdbs = [b for b in self.pdbs if b["metadata"]["namespace"] == namespace
                and self._matches(b["spec"].get("selector"), pod)]
        if len(pdbs) > 1:
            raise ApiError(500, "InternalError", "This pod has more than one "
                           "PodDisruptionBudget, which the eviction subresource does not "
                           "support.")
        if pdbs and self._disruptions_allowed(pdbs[0]) <= 0:
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the "
                           "pod's disruption budget.",
                           {"causes": [{"reason": "DisruptionBudget", "message": "The "
                                        f"disruption budget {pdbs[0]['metadata']['name']} "
                                        "needs more healthy pods"}]})
        self.admit("CREATE", "pods", name, namespace=namespace, subresource="eviction",
                   obj=body)
        self._start_deletion(pod, None)
        return _success(201)

    def delete_pod(self, namespace: str, name: str, query: dict[str, list[str]],
                   options: Any = None) -> Json:
        self.kubelet()
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found',
                           {"name": name, "kind": "pods"})
        if options is not None and (not isinstance(options, dict) or options.get(
                "kind", "DeleteOptions") != "DeleteOptions"):
            raise ApiError(400, "BadRequest", "the body of a DELETE must be DeleteOptions")
        options = options or {}
        preconditions = options.get("preconditions") or {}
        meta = pod["metadata"]
        for field_name, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            wanted = preconditions.get(field_name)
            if wanted is not None and wanted != meta[field_name]:
                raise ApiError(409, "Conflict", f"Precondition failed: {label} in "
                               f"precondition: {wanted}, {label} in object meta: "
                               f"{meta[field_name]}", {"name": name, "kind": "pods"})
        self.admit("DELETE", "pods", name, namespace=namespace, old=pod, obj=None)
        grace = query.get("gracePeriodSeconds")
        seconds = (float(grace[0]) if grace else options.get("gracePeriodSeconds"))
        self._start_deletion(pod, None if seconds is None else float(seconds))
        return _public(pod)

    def get_claim(self, namespace: str, name: str) -> Json:
        claim = self.claims.get((namespace, name))
        if claim is None:
            raise ApiError(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found',
                           {"name": name, "group": "resource.k8s.io", "kind": "resourceclaims"})
        return _public(claim)

    def list_claims(self, namespace: Optional[str]) -> Json:
        items = [_public(c) for (ns, _), c in self.claims.items()
                 if namespace is None or ns == namespace]
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def list_pdbs(self, namespace: str) -> Json:
        self.kubelet()
        items = []
        for pdb in self.pdbs:
            if pdb["metadata"]["namespace"] == namespace:
                self._pdb_status(pdb)
                items.append(_public(pdb))
        return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList",
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def create_event(self, namespace: str, body: Any) -> Json:
        if not isinstance(body, dict) or body.get("kind", "Event") != "Event":
            raise ApiError(400, "BadRequest", "the body must be an Event")
        meta = body.get("metadata") or {}
        involved = body.get("involvedObject") or {}
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match "
                           "the namespace on the request")
        if not involved.get("namespace") and namespace not in ("", "default"):
            raise ApiError(422, "Invalid", "involvedObject.namespace: does not match event "
                           "namespace")
        if not meta.get("name") or not body.get("reason"):
            raise ApiError(422, "Invalid", "metadata.name and reason are required")
        self.admit("CREATE", "events", meta["name"], namespace=namespace, obj=body)
        event = copy.deepcopy(body)
        event["metadata"]["namespace"] = namespace
        event["metadata"]["resourceVersion"] = self.next_rv()
        self.events.append(event)
        return event

    def token_review(self, body: Any) -> Json:
        if not isinstance(body, dict) or body.get("kind") != "TokenReview" or \
                body.get("apiVersion") != "authentication.k8s.io/v1":
            raise ApiError(400, "BadRequest", "the body must be an authentication.k8s.io/v1 "
                           "TokenReview")
        token = (body.get("spec") or {}).get("token") or ""
        user = self.client_tokens.get(token)
        if user is None and token and token == self.token:
            user = {"username": self.username, "uid": "installer-uid",
                    "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                               "system:authenticated"]}
        review = {**copy.deepcopy(body), "metadata": {"creationTimestamp": None}}
        review["status"] = ({"authenticated": True, "user": copy.deepcopy(user),
                             "audiences": ["https://kubernetes.default.svc"]}
                            if user is not None else
                            {"user": {}, "error": "[invalid bearer token, token lookup "
                             "failed]"})
        return review

    def subject_access_review(self, body: Any) -> Json:
        if not isinstance(body, dict) or body.get("kind") != "SubjectAccessReview" or \
                body.get("apiVersion") != "authorization.k8s.io/v1":
            raise ApiError(400, "BadRequest", "the body must be an authorization.k8s.io/v1 "
                           "SubjectAccessReview")
        spec = body.get("spec") or {}
        url = spec.get("nonResourceAttributes")
        if ("resourceAttributes" in spec) == (url is not None):
            raise ApiError(422, "Invalid", 'SubjectAccessReview.authorization.k8s.io "" is '
                           "invalid: spec.resourceAttributes: Invalid value: ...: exactly one "
                           "of nonResourceAttributes or resourceAttributes must be specified")
        if not spec.get("user") and not spec.get("groups"):
            raise ApiError(422, "Invalid", 'SubjectAccessReview.authorization.k8s.io "" is '
                           'invalid: spec.user: Invalid value: "": at least one of user or '
                           "group must be specified")
        allowed = False
        if url is not None:
            principals = {spec.get("user"), *(spec.get("groups") or [])}
            path, verb = url.get("path", ""), url.get("verb", "")
            allowed = any(who in principals and granted_verb in (verb, "*") and (
                granted == path or (granted.endswith("*") and path.startswith(granted[:-1])))
                for who, granted_verb, granted in self.url_grants)
        review = {**copy.deepcopy(body), "metadata": {"creationTimestamp": None}}
        review["status"] = {"allowed": allowed}
        if allowed:
            review["status"]["reason"] = "RBAC: allowed by ClusterRoleBinding"
        return review

    def admit(self, operation: str, resource: str, name: str, *, namespace: str = "",
              subresource: str = "", obj: Optional[Json] = None,
              old: Optional[Json] = None) -> None:
        """Run the ValidatingAdmissionPolicies on a write; raises the API server's denial."""
        if not self.policies:
            return
        from cluster.admission import Authorizer, check, request, user_info

        bound = self.nodes.get(self.token_node or "")
        user = user_info(self.username, self.token_node) if bound is None else user_info(
            self.username, self.token_node, node_uid=bound["metadata"]["uid"])
        req = request(operation, resource, name, user,
                      namespace=namespace, subresource=subresource,
                      obj=_public(obj) if obj is not None else None,
                      old=_public(old) if old is not None else None)
        denied = check(self.policies, req, Authorizer(self.allowed))
        if denied is not None:
            raise ApiError(denied.code, denied.reason,
                           f'{resource} "{name}" is forbidden: {denied.message}',
                           {"name": name, "kind": resource})

    def allowed(self, verb: str, group: str, resource: str, namespace: str = "") -> bool:
        if self.rules is None:
            return True
        from cluster.admission import rbac_authorizer

        return rbac_authorizer(self.rules).allowed(verb, group, resource, namespace)


def _own_unschedulable(node: Json, manager: str, is_set: bool) -> None:
    """managedFields after an Update that changed spec.unschedulable: the manager that made the
    change owns the field (and no one once it is removed)."""
    entries = node["metadata"].get("managedFields") or []
    for entry in entries:
        spec = entry["fieldsV1"].get("f:spec") or {}
        spec.pop("f:unschedulable", None)
        if not spec:
            entry["fieldsV1"].pop("f:spec", None)
    entries = [e for e in entries if e["fieldsV1"]]
    if is_set:
        _updater(entries, manager)["fieldsV1"].setdefault("f:spec", {})["f:unschedulable"] = {}
    node["metadata"]["managedFields"] = entries


def _updater(entries: list[Json], manager: str) -> Json:
    """The managedFields entry of `manager`'s Updates of the object itself (one per manager,
    operation and subresource, as the API server keeps them), added when missing."""
    for entry in entries:
        if entry["manager"] == (manager or "unknown") and entry["operation"] == "Update" and \
                not entry.get("subresource"):
            entry["time"] = _now()
            return entry
    entry = {"manager": manager or "unknown", "operation": "Update", "apiVersion": "v1",
             "time": _now(), "fieldsType": "FieldsV1", "fieldsV1": {}}
    entries.append(entry)
    return entry


def _owned_keys(entry: Json, kind: str) -> set[str]:
    """The label or annotation keys a managedFields entry owns."""
    owned = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get(f"f:{kind}") or {}
    return {k[2:] for k in owned if k.startswith("f:")}


def _disown(entry: Json, kind: str, key: str) -> None:
    """Take one label or annotation key from a managedFields entry (an entry left owning
    nothing has empty fieldsV1, and is dropped)."""
    meta = entry["fieldsV1"].get("f:metadata") or {}
    owned = meta.get(f"f:{kind}") or {}
    owned.pop(f"f:{key}", None)
    if not owned:
        meta.pop(f"f:{kind}", None)
    if not meta:
        entry["fieldsV1"].pop("f:metadata", None)


def _take_labels(merged: Json, node: Json, manager: str) -> None:
    """managedFields after an Update that changed labels or annotations: each key it set is
    its manager's alone (taken from appliers and other updaters: the next apply of another
    value is a conflict unless forced), and a key it removed is no one's."""
    entries = copy.deepcopy(merged["metadata"].get("managedFields") or [])
    for kind in ("labels", "annotations"):
        before = node["metadata"].get(kind) or {}
        after = merged["metadata"].get(kind) or {}
        for key in [k for k in set(before) | set(after) if before.get(k) != after.get(k)]:
            for entry in entries:
                _disown(entry, kind, key)
            if key in after:
                fields = _updater(entries, manager)["fieldsV1"]
                fields.setdefault("f:metadata", {}).setdefault(f"f:{kind}", {})[f"f:{key}"] = {}
    if entries or "managedFields" in merged["metadata"]:
        merged["metadata"]["managedFields"] = [e for e in entries if e["fieldsV1"]]


def _without_times(node: Json) -> Json:
    """The node as a no-op check sees it: managedFields' timestamps left out."""
    copied = copy.deepcopy(node)
    for entry in copied["metadata"].get("managedFields") or []:
        entry.pop("time", None)
    return copied


def _merge_by_type(old: list[Json], patch: list[Json]) -> list[Json]:
    """Strategic merge of a list whose patchMergeKey is `type`: a patched item is merged into
    the item of its type (or appended); the others stay as they are, in their order."""
    result = [copy.deepcopy(item) for item in old]
    for item in patch:
        at = next((i for i, o in enumerate(result) if o.get("type") == item.get("type")), None)
        if at is None:
            result.append(copy.deepcopy(item))
        else:
            result[at] = merge_patch(result[at], item)
    return result


def _own_condition(node: Json, manager: str, kind: str) -> None:
    """managedFields after a status Update of one condition: its manager owns it."""
    key = f'k:{{"type":"{kind}"}}'
    entries = [e for e in node["metadata"].get("managedFields") or []
               if key not in ((e["fieldsV1"].get("f:status") or {}).get("f:conditions") or {})]
    entries.append({"manager": manager or "unknown", "operation": "Update", "apiVersion": "v1",
                    "time": _now(), "fieldsType": "FieldsV1", "subresource": "status",
                    "fieldsV1": {"f:status": {"f:conditions": {key: {}}}}})
    node["metadata"]["managedFields"] = entries


def _public(obj: Json) -> Json:
    return {k: copy.deepcopy(v) for k, v in obj.items() if not k.startswith("_")}


def _success(code: int) -> Json:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "code": code}


_ROUTES = [
    ("GET", re.compile(r"^/api/v1/nodes$"), "list", "", "nodes"),
    ("GET", re.compile(r"^/api/v1/nodes/([^/]+)$"), "get", "", "nodes"),
    ("PATCH", re.compile(r"^/api/v1/nodes/([^/]+)$"), "patch", "", "nodes"),
    ("PATCH", re.compile(r"^/api/v1/nodes/([^/]+)/status$"), "patch", "", "nodes/status"),
    ("GET", re.compile(r"^/api/v1/pods$"), "list", "", "pods"),
    ("POST", re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction$"), "create", "",
     "pods/eviction"),
    ("DELETE", re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$"), "delete", "", "pods"),
    ("GET", re.compile(r"^/apis/policy/v1/namespaces/([^/]+)/poddisruptionbudgets$"), "list",
     "policy", "poddisruptionbudgets"),
    ("POST", re.compile(r"^/api/v1/namespaces/([^/]+)/events$"), "create", "", "events"),
    ("POST", re.compile(r"^/apis/authentication\.k8s\.io/v1/tokenreviews$"), "create",
     "authentication.k8s.io", "tokenreviews"),
    ("POST", re.compile(r"^/apis/authorization\.k8s\.io/v1/subjectaccessreviews$"), "create",
     "authorization.k8s.io", "subjectaccessreviews"),
    ("GET", re.compile(r"^/apis/resource\.k8s\.io/(v1|v1beta[12])/namespaces/([^/]+)/"
                       r"resourceclaims/([^/]+)$"), "get", "resource.k8s.io", "resourceclaims"),
    ("GET", re.compile(r"^/apis/resource\.k8s\.io/(v1|v1beta[12])/namespaces/([^/]+)/"
                       r"resourceclaims$"), "list", "resource.k8s.io", "resourceclaims"),
    ("GET", re.compile(r"^/apis/resource\.k8s\.io/(v1|v1beta[12])/resourceclaims$"), "list",
     "resource.k8s.io", "resourceclaims"),
]


class _Handler(QuietHandler):
    server: _Server

    def _handle(self) -> None:
        cluster = self.server.cluster
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        status, answer = 200, None
        recorded: Any = None
        try:
            if not self._authenticated(cluster):
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if self.command == "GET" and url.path == "/apis/resource.k8s.io":
                # Discovery: a non-resource URL every authenticated user may read.
                return self._discovery(cluster)
            for method, pattern, verb, group, resource in _ROUTES:
                match = pattern.match(url.path)
                if method != self.command or not match:
                    continue
                path_ns = re.match(r"^/apis?/(?:[^/]+/)?v1(?:beta[12])?/namespaces/([^/]+)/",
                                   url.path)
                if not cluster.allowed(verb, group, resource,
                                       path_ns.group(1) if path_ns else ""):
                    raise ApiError(403, "Forbidden", f'{resource} is forbidden: User '
                                   f'"{cluster.username}" cannot {verb} resource '
                                   f'"{resource}" in API group "{group}"')
                body = json.loads(raw) if raw else None
                recorded = body
                if group == "resource.k8s.io" and match.group(1) not in cluster.resource_versions:
                    with cluster.lock:
                        cluster.requests.append(Request(self.command, url.path, url.query, 404,
                                                        None))
                    return self._plain_404()
                with cluster.lock:
                    status, answer = self._dispatch(cluster, url.path, match.groups(),
                                                    query, body)
                break
            else:
                raise ApiError(404, "NotFound", f"the stand-in does not serve {self.command} "
                               f"{url.path}")
        except ApiError as exc:
            status = exc.code
            answer = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                      "status": "Failure", "message": exc.message, "reason": exc.reason,
                      "code": exc.code, **({"details": exc.details} if exc.details else {})}
        except ValueError:
            status = 400
            answer = {"kind": "Status", "status": "Failure", "reason": "BadRequest",
                      "message": "the body is not JSON", "code": 400}
        with cluster.lock:
            cluster.requests.append(Request(self.command, url.path, url.query, status, recorded))
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _discovery(self, cluster: Cluster) -> None:
        with cluster.lock:
            cluster.requests.append(Request("GET", "/apis/resource.k8s.io", "", 200 if
                                            cluster.resource_versions else 404, None))
            versions = [{"groupVersion": f"resource.k8s.io/{v}", "version": v}
                        for v in cluster.resource_versions]
        if not versions:
            return self._plain_404()
        data = json.dumps({"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io",
                           "versions": versions, "preferredVersion": versions[0]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _plain_404(self) -> None:
        """What kube-apiserver's mux answers for a path no served group version has."""
        data = b"404 page not found\n"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authenticated(self, cluster: Cluster) -> bool:
        """The bearer token, or with `token` None a client certificate the TLS layer verified
        against the client CA (kube-apiserver asks for one but lets a client without one finish
        the handshake and answers it 401)."""
        if cluster.token is not None:
            return self.headers.get("Authorization") == f"Bearer {cluster.token}"
        peer = getattr(self.connection, "getpeercert", None)
        return bool(peer and peer())

    def _dispatch(self, cluster: Cluster, path: str, groups: tuple[str, ...],
                  query: dict[str, list[str]], body: Any) -> tuple[int, Json]:
        if self.command == "GET" and path.startswith("/api/v1/nodes/"):
            return 200, cluster.get_node(groups[0])
        if self.command == "GET" and path == "/api/v1/nodes":
            return 200, cluster.list_nodes(query)
        if self.command == "PATCH":
            # The API server's default field manager is the User-Agent's product token.
            manager = (query.get("fieldManager") or [""])[0] or (
                self.headers.get("User-Agent") or "").split("/", 1)[0]
            if self.headers.get("Content-Type") == "application/apply-patch+yaml" and \
                    not path.endswith("/status"):
                return 200, cluster.apply_node(groups[0], body, (query.get("fieldManager")
                                                                 or [""])[0],
                                               (query.get("force") or [""])[0] == "true")
            if path.endswith("/status"):
                return 200, cluster.patch_node_status(
                    groups[0], self.headers.get("Content-Type", ""), body, manager)
            return 200, cluster.patch_node(groups[0], self.headers.get("Content-Type", ""),
                                           body, manager)
        if self.command == "GET" and "/resourceclaims" in path:
            if path.endswith("/resourceclaims"):
                return 200, cluster.list_claims(groups[1] if len(groups) > 1 else None)
            return 200, cluster.get_claim(groups[1], groups[2])
        if self.command == "GET" and path.endswith("/poddisruptionbudgets"):
            return 200, cluster.list_pdbs(groups[0])
        if self.command == "GET":
            return 200, cluster.list_pods(query)
        if path.endswith("/tokenreviews"):
            return 201, cluster.token_review(body)
        if path.endswith("/subjectaccessreviews"):
            return 201, cluster.subject_access_review(body)
        if path.endswith("/eviction"):
            return 201, cluster.evict(groups[0], groups[1], body)
        if self.command == "DELETE":
            return 200, cluster.delete_pod(groups[0], groups[1], query, body)
        return 201, cluster.create_event(groups[0], body)

    do_GET = do_PATCH = do_POST = do_DELETE = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    cluster: Cluster

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that closes its connection early (a timed-out request) is not an
        error; anything else still prints its traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class ApiServer:
    """`with ApiServer(cluster) as api:` serves on 127.0.0.1 (HTTPS with a server-side `tls`
    context); `api.kubeconfig(dir)` writes a kubeconfig for it."""

    def __init__(self, cluster: Cluster, tls: Optional[ssl.SSLContext] = None) -> None:
        self.cluster = cluster
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.cluster = cluster
        self._scheme = "http"
        if tls is not None:  # HTTPS, as every real API server serves: the handshake on accept
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
            self._scheme = "https"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def kubeconfig(self, directory: Path) -> Path:
        return write_kubeconfig(directory / "kubeconfig", self.url, self.cluster.token or "")


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
        "clusters": [{"name": "stand-in", "cluster": {"server": server}}],
        "users": [{"name": "installer", "user": {"token": token}}],
        "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in",
                                                       "user": "installer"}}],
    }
    path.write_text(json.dumps(config))
    return path


def cluster_role_rules(*rbac_yaml: Path) -> list[Json]:
    """The rules of every ClusterRole, and of every Role (kept to its namespace as
    `_namespace`), in manifest files."""
    import yaml

    rules: list[Json] = []
    for path in rbac_yaml:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ClusterRole":
                rules += [dict(rule) for rule in doc["rules"]]
            elif doc and doc.get("kind") == "Role":
                namespace = doc["metadata"]["namespace"]
                rules += [{**rule, "_namespace": namespace} for rule in doc["rules"]]
    if not rules:
        raise ValueError(f"no ClusterRole or Role in {', '.join(map(str, rbac_yaml))}")
    return rules


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=Path, required=True,
                        help="JSON: {node: {name, labels}, pods: [...], kill_on_pause: {c: pid}}")
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--dump", type=Path, help="write the node, events and writes here on "
                        "every change")
    parser.add_argument("--role", type=Path, action="append",
                        help="enforce the rules of the ClusterRoles and Roles in this file")
    parser.add_argument("--policy", type=Path, help="enforce these ValidatingAdmissionPolicies "
                        "(the token carries the seed node's name as its node claim)")
    args = parser.parse_args()
    seed = json.loads(args.seed.read_text())
    node = seed["node"]
    policies = None
    if args.policy:
        from cluster.admission import load_policies

        policies = load_policies(args.policy)
    cluster = Cluster(rules=cluster_role_rules(*args.role) if args.role else None,
                      policies=policies, token_node=node["name"])
    cluster.add_node(node["name"], node.get("labels"), node.get("unschedulable", False))
    for pod in seed.get("pods", []):
        cluster.add_pod(pod["namespace"], pod["name"], node["name"], gpus=pod.get("gpus", 0),
                        labels=pod.get("labels"))
    for component, pid in (seed.get("kill_on_pause") or {}).items():
        cluster.on_node_change.append(kill_on_pause(component, int(pid)))
    with ApiServer(cluster) as server:
        args.port_file.write_text(server.url)
        while True:
            time.sleep(0.2)
            if args.dump:
                with cluster.lock:
                    state = {"node": _public(cluster.nodes[node["name"]]),
                             "events": [{"reason": e["reason"], "message": e["message"],
                                         "type": e["type"]} for e in cluster.events],
                             "writes": [f"{r.method} {r.path}" for r in cluster.requests
                                        if r.is_write]}
                tmp = args.dump.with_suffix(".tmp")
                tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
                tmp.replace(args.dump)


def kill_on_pause(component: str, pid: int) -> Callable[[Cluster, Json], None]:
    """The DaemonSet controller and the kubelet: once the node no longer matches the
    component's node affinity (its deploy label paused), its pod's process is stopped."""
    import os
    import signal

    key = f"nvidia.com/gpu.deploy.{component}"

    def react(cluster: Cluster, node: Json) -> None:
        if (node["metadata"].get("labels") or {}).get(key) == "paused-for-driver-upgrade":
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    return react


if __name__ == "__main__":
    main()
