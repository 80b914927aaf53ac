"""The DaemonSet side of the scheduling gate: components/scheduling-gate brings a
ClusterRole that reads and patches nodes only, the base's ServiceAccount token, its copy of the
node admission policy and the `installer gate` container; the taint key agrees everywhere it is
named; and the policy's CEL (cel-python), with its authorizer answering from the roles bound,
admits the gate's writes on its own node, and with both Components both features' writes,
nothing else."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest

pytest.importorskip("celpy", reason="pip install cel-python")

from cluster.admission import (
    NOTHING_BOUND,
    Authorizer,
    Denied,
    _evaluate,
    check,
    rbac_authorizer,
    request,
    user_info,
)
from cluster.apiserver import cluster_role_rules

from deploy.manifests import (
    DAEMONSET_DIR,
    READY_DIR,
    SAMPLE_NODE_NAME,
    container_env,
    installer_container,
    installer_daemonset,
    load_all,
    pod_spec,
    render,
)
from installer.cluster import gate, protocol
from installer.config import from_env

COMPONENTS = DAEMONSET_DIR / "components"
GATE_RBAC = COMPONENTS / "scheduling-gate" / "rbac.yaml"
PROTOCOL_RBAC = COMPONENTS / "upgrade-protocol" / "rbac.yaml"
GATE_ROLE = rbac_authorizer(cluster_role_rules(GATE_RBAC))
PROTOCOL_ROLE = rbac_authorizer(cluster_role_rules(PROTOCOL_RBAC))
BOTH_ROLES = rbac_authorizer(cluster_role_rules(GATE_RBAC, PROTOCOL_RBAC))
KEY = "nvidia.com/gpu.driver-not-ready"
ME, OTHER = "gpu-node-1", "gpu-node-2"
TOKEN = user_info(node=ME)
ADMIN_TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def _policies(docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    bound = {d["spec"]["policyName"]: d["metadata"]["name"] for d in docs
             if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    return [(d, bound[d["metadata"]["name"]]) for d in docs
            if d["kind"] == "ValidatingAdmissionPolicy"]


@functools.cache
def rendered(where: str) -> list[dict[str, Any]]:
    """`kubectl kustomize` once per directory (read-only: callers copy what they change)."""
    return render(DAEMONSET_DIR / where)


def gate_docs() -> list[dict[str, Any]]:
    return rendered("overlays/scheduling-gate")


def both_docs() -> list[dict[str, Any]]:
    return rendered("examples/gate-and-upgrade-protocol")


def _container(ds: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec(ds)["containers"] if c["name"] == name]
    return found


def _granted(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for d in docs if d["kind"] == "ClusterRole" for rule in d["rules"]
            for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


# --------------------------------------------------------------------------- the manifests


def test_the_gate_brings_a_node_only_role_its_token_and_its_policy() -> None:
    kinds = sorted(d["kind"] for d in gate_docs())
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                            "DaemonSet"])
    assert _granted(gate_docs()) == {("", "nodes", "get"), ("", "nodes", "patch"),
                                   ("", "nodes", "set-scheduling-gate")}
    (account,) = [d for d in gate_docs() if d["kind"] == "ServiceAccount"]
    (binding,) = [d for d in gate_docs() if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "kube-system"}]
    spec = pod_spec(installer_daemonset(gate_docs()))
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is True
    (vap,) = _policies(gate_docs())
    assert vap[0]["spec"]["failurePolicy"] == "Fail"
    (vap_binding,) = [d for d in gate_docs() if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert vap_binding["spec"]["validationActions"] == ["Deny"]


def test_the_installer_runs_with_the_gate_on_and_the_protocol_off() -> None:
    ds = installer_daemonset(gate_docs())
    config = from_env(container_env(installer_container(ds)))
    assert config.scheduling_gate is True and config.upgrade_protocol is False
    assert config.node_name == SAMPLE_NODE_NAME and config.gate_taint == KEY


def test_the_gate_container_is_the_installer_image_unprivileged_reading_the_ready_dir() -> None:
    ds = installer_daemonset(gate_docs())
    container = _container(ds, "scheduling-gate")
    assert container["args"] == ["gate"]
    assert container["image"] == installer_container(ds)["image"]
    assert container["image"].startswith("registry.example.com/nvidia-driver-installer:")
    config = from_env(container_env(container))
    assert config.scheduling_gate and config.node_name == SAMPLE_NODE_NAME
    assert str(config.root) == "/"  # the readiness files at their own path, /proc the host's
    security = container["securityContext"]
    assert not security.get("privileged", False)
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["volumeMounts"] == [{"name": "installer-ready", "mountPath": READY_DIR,
                                          "readOnly": True}]
    volumes = {v["name"]: v for v in pod_spec(ds)["volumes"]}
    assert volumes["installer-ready"]["hostPath"]["path"] == READY_DIR
    assert "limits" in container["resources"] and "memory" in container["resources"]["limits"]


def test_both_components_share_one_account_and_grant_the_union() -> None:
    accounts = [d for d in both_docs() if d["kind"] == "ServiceAccount"]
    assert len(accounts) == 1
    assert _granted(both_docs()) == _granted(gate_docs()) | _granted(
        rendered("overlays/upgrade-protocol"))
    config = from_env(container_env(installer_container(installer_daemonset(both_docs()))))
    assert config.scheduling_gate and config.upgrade_protocol


def test_the_copies_of_the_node_policy_are_the_same() -> None:
    """Each Component works alone and any together only because they carry one policy."""
    copies = {}
    components = ("upgrade-protocol", "scheduling-gate", "cluster-signals")
    for component in components:
        for doc in load_all(COMPONENTS / component / "admission-policy.yaml"):
            if doc["kind"] == "ValidatingAdmissionPolicy" and "gateTaintKey" in str(doc):
                copies[component] = doc
    assert set(copies) == set(components)
    for component in components[1:]:
        assert copies[component]["spec"] == copies["upgrade-protocol"]["spec"], component
    assert len({c["metadata"]["name"] for c in copies.values()}) == len(components)


def _policy_keys(docs: list[dict[str, Any]]) -> set[str]:
    keys = set()
    for policy, _ in _policies(docs):
        for variable in policy["spec"].get("variables", []):
            if variable["name"] == "gateTaintKey":
                keys.add(str(_evaluate(variable["expression"], {})))
    return keys


@pytest.mark.parametrize(("where", "key"), [
    ("overlays/scheduling-gate", KEY),
    ("examples/gate-and-upgrade-protocol", KEY),
    ("examples/scheduling-gate-autoscaler",
     "startup-taint.cluster-autoscaler.kubernetes.io/nvidia-driver-not-ready"),
])
def test_the_taint_key_agrees_in_the_installer_the_container_and_every_policy(
        where: str, key: str) -> None:
    docs = rendered(where)
    ds = installer_daemonset(docs)
    assert from_env(container_env(installer_container(ds))).gate_taint == key
    assert from_env(container_env(_container(ds, "scheduling-gate"))).gate_taint == key
    assert _policy_keys(docs) == {key}


# --------------------------------------------------------------------------- the CEL


def node(name: str = ME) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": "9c1e", "resourceVersion": "4711",
                     "labels": {"kubernetes.io/hostname": name,
                                "nvidia.com/gpu.deploy.device-plugin": "true"}},
        "spec": {"podCIDR": "10.4.1.0/24", "providerID": f"gce://p/z/{name}",
                 "taints": [dict(ADMIN_TAINT),
                            {"key": KEY, "value": "true", "effect": "NoSchedule"}]},
    }


def update(old: dict[str, Any], change: Any, authorizer: Authorizer = GATE_ROLE,
           docs: list[dict[str, Any]] | None = None,
           user: dict[str, Any] = TOKEN) -> Denied | None:
    new = copy.deepcopy(old)
    change(new)
    policies = _policies(gate_docs() if docs is None else docs)
    return check(policies, request("UPDATE", "nodes", old["metadata"]["name"], user, obj=new,
                                   old=old), authorizer)


def apply_patch(node_: dict[str, Any], patch: dict[str, Any]) -> None:
    from cluster.apiserver import merge_patch

    merged = merge_patch(node_, patch)
    node_.clear()
    node_.update(merged)


def gate_patch(tainted: bool, label: Any) -> Any:
    """The installer's own patch (installer.cluster.gate) for a node."""
    def change(n: dict[str, Any]) -> None:
        patch = gate._patch(copy.deepcopy(n), KEY, tainted, label)
        assert patch is not None
        apply_patch(n, patch)
    return change


def untainted(n: dict[str, Any]) -> None:
    n["spec"]["taints"] = [dict(ADMIN_TAINT)]


@pytest.mark.parametrize(("what", "start", "change"), [
    ("open: the taint off, the label on", node, gate_patch(False, "580.105.08")),
    ("close: the taint back on", lambda: _with(node(), untainted), gate_patch(True, gate._KEEP)),
    ("uninstall: on, label off",
     lambda: _with(node(), untainted,
                   lambda n: n["metadata"]["labels"].update({gate.VERSION_LABEL: "580"})),
     gate_patch(True, None)),
])
def test_the_gates_own_writes_on_its_own_node_are_admitted(what: str, start: Any,
                                                           change: Any) -> None:
    for authorizer, docs in ((GATE_ROLE, gate_docs()), (BOTH_ROLES, both_docs())):
        assert update(start(), change, authorizer, docs) is None, what


def _with(n: dict[str, Any], *changes: Any) -> dict[str, Any]:
    for change in changes:
        change(n)
    return n


@pytest.mark.parametrize(("what", "change", "says"), [
    ("cordon", lambda n: n["spec"].update(unschedulable=True), "only with the upgrade protocol"),
    ("pause a component", lambda n: n["metadata"]["labels"].update(
        {"nvidia.com/gpu.deploy.device-plugin": protocol.PAUSED}), "may not change the labels"),
    ("an admin's taint off", lambda n: n["spec"].update(taints=n["spec"]["taints"][1:]),
     "other than the scheduling gate taint (nvidia.com/gpu.driver-not-ready:NoSchedule): "
     "dedicated"),
    ("the gate's key as NoExecute", lambda n: n["spec"]["taints"].append(
        {"key": KEY, "effect": "NoExecute"}), "may not add, change or remove taints"),
    ("an admin's taint changed", lambda n: n["spec"]["taints"][0].update(value="web"),
     "dedicated"),
    ("another label", lambda n: n["metadata"]["labels"].update(team="x"), "team"),
    ("the upgrade annotation", lambda n: n["metadata"].setdefault("annotations", {}).update(
        {protocol.ANNOTATION: "{}"}), "annotations"),
    ("podCIDR", lambda n: n["spec"].update(podCIDR="10.9.9.0/24"), "spec"),
])
def test_the_gate_token_writes_nothing_else(what: str, change: Any, says: str) -> None:
    denied = update(node(), change)
    assert denied is not None and denied.code == 403, what
    assert says in denied.message, denied.message


def test_another_node_and_a_token_without_a_claim_are_denied() -> None:
    denied = update(node(OTHER), gate_patch(False, "580.105.08"))
    assert denied is not None and f"({ME}), not {OTHER}" in denied.message
    denied = update(node(), gate_patch(False, "580.105.08"), user=user_info(node=None))
    assert denied is not None and "the token carries no node claim" in denied.message


def test_the_protocols_role_alone_may_not_touch_the_gate() -> None:
    protocol_docs = rendered("overlays/upgrade-protocol")
    for change in (gate_patch(False, "580.105.08"), gate_patch(False, gate._KEEP)):
        denied = update(node(), change, PROTOCOL_ROLE, protocol_docs)
        assert denied is not None and denied.code == 403


def test_with_both_roles_the_protocols_writes_pass_both_copies() -> None:
    def begin(n: dict[str, Any]) -> None:
        n["spec"]["unschedulable"] = True
        n["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] = protocol.PAUSED
        n["metadata"]["labels"][protocol.STATE_LABEL] = "draining"
        n["metadata"].setdefault("annotations", {})[protocol.ANNOTATION] = "{}"

    assert len(_policies(both_docs())) == 3  # own-node, own-pods, the gate's copy
    assert update(node(), begin, BOTH_ROLES, both_docs()) is None
    denied = update(node(), begin, GATE_ROLE, both_docs())  # the protocol's role not bound
    assert denied is not None


def test_an_account_with_no_role_bound_changes_nothing() -> None:
    assert update(node(), gate_patch(False, "580.105.08"), NOTHING_BOUND) is not None
