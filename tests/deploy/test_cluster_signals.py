"""The DaemonSet side of the cluster signals and of the taint conventions of autoscalers and
readiness controllers: components/cluster-signals grants exactly nodes get, nodes/status patch
and events create (in default), mounts the base's ServiceAccount token and adds the
`driver-condition` container; it renders alone and beside the scheduling gate and the upgrade
protocol; the Karpenter NodePool's startup taint is the gate's key everywhere it is named; the
Node Readiness Controller's rule waits for the installer's condition type under the
readiness.k8s.io/ prefix."""

from __future__ import annotations

from os.path import relpath
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deploy.manifests import (
    DAEMONSET_DIR,
    SAMPLE_NODE_NAME,
    container_env,
    installer_container,
    installer_daemonset,
    load_all,
    pod_spec,
    render,
)
from installer import setting_parsers
from installer.cluster import condition
from installer.config import from_env
from installer.errors import ConfigError

EXAMPLES = DAEMONSET_DIR / "examples"
COMPONENTS = DAEMONSET_DIR / "components"


def _granted(docs: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    return {(d["metadata"].get("namespace", "*") if d["kind"] == "Role" else "*", g, r, v)
            for d in docs if d["kind"] in ("Role", "ClusterRole")
            for rule in d["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def _container(ds: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec(ds)["containers"] if c["name"] == name]
    return found


def test_the_component_brings_identity_least_rbac_policy_and_the_watcher() -> None:
    docs = render(EXAMPLES / "node-readiness-controller")
    ds = installer_daemonset(docs)
    spec = pod_spec(ds)
    assert spec["automountServiceAccountToken"] is True
    assert spec["serviceAccountName"] == "nvidia-driver-installer"
    assert _granted(docs) == {("*", "", "nodes", "get"), ("*", "", "nodes/status", "patch"),
                              ("default", "", "events", "create")}
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"} \
        == {"nvidia-driver-installer-node-condition", "nvidia-driver-installer-node-events"}
    init = from_env(container_env(installer_container(ds)))
    assert init.cluster_signals and not init.scheduling_gate
    watcher = _container(ds, "driver-condition")
    assert watcher["args"] == ["gate"]
    assert watcher["image"] == installer_container(ds)["image"]
    config = from_env(container_env(watcher))
    assert config.cluster_signals and config.node_name == SAMPLE_NODE_NAME
    assert not config.scheduling_gate
    security = watcher["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]


def test_all_three_components_render_together(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {relpath(DAEMONSET_DIR / 'overlays' / 'ubuntu', tmp_path)}\n"
        "components:\n"
        + "".join(f"  - {relpath(COMPONENTS / c, tmp_path)}\n"
                  for c in ("upgrade-protocol", "scheduling-gate", "cluster-signals")))
    docs = render(tmp_path)
    ds = installer_daemonset(docs)
    init = from_env(container_env(installer_container(ds)))
    assert init.cluster_signals and init.scheduling_gate and init.upgrade_protocol
    assert {c["name"] for c in pod_spec(ds)["containers"]} >= {"scheduling-gate",
                                                               "driver-condition"}
    assert ("*", "", "nodes/status", "patch") in _granted(docs)


def _gate_keys(docs: list[dict[str, Any]]) -> set[str]:
    ds = installer_daemonset(docs)
    keys = {from_env(container_env(installer_container(ds))).gate_taint,
            from_env(container_env(_container(ds, "scheduling-gate"))).gate_taint}
    for doc in docs:
        if doc["kind"] == "ValidatingAdmissionPolicy":
            for variable in doc["spec"].get("variables", []):
                if variable["name"] == "gateTaintKey":
                    keys.add(variable["expression"].strip("'"))
    return keys


def test_karpenter_startup_taint_is_the_gate_key_everywhere() -> None:
    (pool,) = load_all(EXAMPLES / "scheduling-gate-karpenter" / "nodepool.yaml")
    assert (pool["apiVersion"], pool["kind"]) == ("karpenter.sh/v1", "NodePool")
    taints = pool["spec"]["template"]["spec"]["startupTaints"]
    assert [t["effect"] for t in taints] == ["NoSchedule"]
    assert _gate_keys(render(EXAMPLES / "scheduling-gate-karpenter")) == {taints[0]["key"]}


def test_cluster_autoscaler_startup_taint_prefix() -> None:
    keys = _gate_keys(render(EXAMPLES / "scheduling-gate-autoscaler"))
    assert len(keys) == 1
    assert keys.pop().startswith("startup-taint.cluster-autoscaler.kubernetes.io/")


def test_node_readiness_rule_waits_for_the_installer_condition() -> None:
    (rule,) = load_all(EXAMPLES / "node-readiness-controller" / "node-readiness-rule.yaml")
    assert (rule["apiVersion"], rule["kind"]) == ("readiness.node.x-k8s.io/v1alpha1",
                                                  "NodeReadinessRule")
    assert rule["spec"]["conditions"] == [{"type": condition.TYPE, "requiredStatus": "True"}]
    assert rule["spec"]["enforcementMode"] in ("continuous", "bootstrap-only")
    key = rule["spec"]["taint"]["key"]
    assert key.startswith("readiness.k8s.io/") and rule["spec"]["taint"]["effect"] == \
        "NoSchedule"
    # A valid taint key (one prefix, one name), as the API server demands of a node's taints.
    named = SimpleNamespace(env="NVIDIA_INSTALLER_GATE_TAINT")
    assert setting_parsers.taint_key(key, named) == key  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        setting_parsers.taint_key("readiness.k8s.io/nvidia.com/driver-not-ready",
                                  named)  # type: ignore[arg-type]
