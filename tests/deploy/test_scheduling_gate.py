"""The DaemonSet side of the scheduling gate, as rendered (no API server): components/
scheduling-gate brings a ClusterRole that reads and patches nodes only, the base's
ServiceAccount token, its copy of the node admission policy and the `installer gate` container;
the taint key agrees everywhere it is named. What the policy admits is the real server's to
judge: tests/cluster/test_scheduling_gate.py and test_policies_real.py."""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest
from lib.manifests import (
    DAEMONSET_DIR,
    READY_DIR,
    SAMPLE_NODE_NAME,
    container_config,
    gate_sidecar,
    installer_config,
    installer_daemonset,
    load_all,
    pod_spec,
    render,
)

COMPONENTS = DAEMONSET_DIR / "components"
KEY = "nvidia.com/gpu.driver-not-ready"
# A CEL string literal in single quotes with nothing to unescape: what gateTaintKey must be, so
# that the key can be read here without evaluating CEL.
CEL_PLAIN_STRING = re.compile(r"'([^'\\]*)'")


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
    config = installer_config(ds)
    assert config.scheduling_gate is True and config.upgrade_protocol is False
    assert config.node_name == SAMPLE_NODE_NAME and config.gate_taint == KEY


def test_the_gate_container_is_the_installer_image_unprivileged_reading_the_ready_dir() -> None:
    ds = installer_daemonset(gate_docs())
    container = gate_sidecar(ds, "scheduling-gate")
    assert container["image"].startswith("registry.example.com/nvidia-driver-installer:")
    config = container_config(container)
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
    config = installer_config(installer_daemonset(both_docs()))
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
                literal = CEL_PLAIN_STRING.fullmatch(variable["expression"].strip())
                assert literal, variable["expression"]
                keys.add(literal.group(1))
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
    assert installer_config(ds).gate_taint == key
    assert container_config(gate_sidecar(ds, "scheduling-gate")).gate_taint == key
    assert _policy_keys(docs) == {key}
