"""The DaemonSet side of the cluster signals and of the taint conventions of autoscalers and
readiness controllers: components/cluster-signals grants exactly nodes get, nodes/status patch
and events create (in default), mounts the base's ServiceAccount token and adds the
`driver-condition` container; it renders alone and beside the scheduling gate and the upgrade
protocol; the Karpenter NodePool's startup taint is the gate's key everywhere it is named; the
Node Readiness Controller's rule waits for the installer's condition type under the
readiness.k8s.io/ prefix; the driver-on-node example turns GKE's annotations on and moves the
device plugin onto nodes by the labels the installer publishes."""

from __future__ import annotations

from os.path import relpath
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from lib.manifests import (
    DAEMONSET_DIR,
    SAMPLE_NODE_NAME,
    container_config,
    gate_sidecar,
    granted,
    installer_config,
    installer_daemonset,
    load_all,
    pod_spec,
    render,
)

from installer import setting_parsers
from installer.cluster import condition, driver_labels
from installer.errors import ConfigError

EXAMPLES = DAEMONSET_DIR / "examples"
COMPONENTS = DAEMONSET_DIR / "components"


def test_the_component_brings_identity_least_rbac_policy_and_the_watcher() -> None:
    docs = render(EXAMPLES / "node-readiness-controller")
    ds = installer_daemonset(docs)
    spec = pod_spec(ds)
    assert spec["automountServiceAccountToken"] is True
    assert spec["serviceAccountName"] == "nvidia-driver-installer"
    assert granted(docs) == {("*", "", "nodes", "get"), ("*", "", "nodes", "patch"),
                             ("*", "", "nodes", "publish-driver-version"),
                             ("*", "", "nodes/status", "patch"),
                             ("default", "", "events", "create")}
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"} \
        == {"nvidia-driver-installer-node-condition", "nvidia-driver-installer-node-events",
            "nvidia-driver-installer-driver-version"}
    init = installer_config(ds)
    assert init.cluster_signals and not init.scheduling_gate
    watcher = gate_sidecar(ds, "driver-condition")
    config = container_config(watcher)
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
    init = installer_config(ds)
    assert init.cluster_signals and init.scheduling_gate and init.upgrade_protocol
    assert {c["name"] for c in pod_spec(ds)["containers"]} >= {"scheduling-gate",
                                                               "driver-condition"}
    assert ("*", "", "nodes/status", "patch") in granted(docs)


def _gate_keys(docs: list[dict[str, Any]]) -> set[str]:
    ds = installer_daemonset(docs)
    keys = {installer_config(ds).gate_taint,
            container_config(gate_sidecar(ds, "scheduling-gate")).gate_taint}
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


def _selects(terms: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Whether a node with `labels` matches nodeSelectorTerms (the terms ORed, each term's
    expressions ANDed; NotIn and DoesNotExist match an absent key, Gt and Lt need an integer
    value), as the scheduler's nodeaffinity plugin decides."""
    def holds(expression: dict[str, Any]) -> bool:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        if operator in ("Gt", "Lt"):
            if not labels.get(key, "").isdigit():
                return False
            value, bound = int(labels[key]), int(values[0])
            return value > bound if operator == "Gt" else value < bound
        return {"In": key in labels and labels[key] in values,
                "NotIn": key not in labels or labels[key] not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[operator]

    return any(all(holds(e) for e in term.get("matchExpressions") or []) for term in terms)


def test_the_driver_on_node_example_selects_by_the_labels_the_installer_publishes() -> None:
    example = EXAMPLES / "driver-on-node"
    ds = installer_daemonset(render(example))
    config = installer_config(ds)
    assert config.cluster_signals and config.gke_driver_annotations
    assert not config.gpu_feature_discovery
    (patch,) = load_all(example / "device-plugin-on-gpu-present.yaml")
    terms = patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]

    def published(version: str) -> dict[str, str]:
        wanted = driver_labels.wanted(config, version)
        assert wanted is not None
        return wanted[0]

    assert _selects(terms, published("580.105.08"))
    assert _selects(terms, published("595.91.07"))
    assert not _selects(terms, published("570.195.03"))  # below the example's floor
    assert not _selects(terms, {})  # no verified driver yet: no plugin
    paused = {**published("580.105.08"), "nvidia.com/gpu.deploy.device-plugin":
              "paused-for-driver-upgrade"}
    assert not _selects(terms, paused)
    # The patch keeps the plugin's own pause for the upgrade protocol.
    (plugin,) = load_all(DAEMONSET_DIR / "extras" / "device-plugin.yaml")
    (own,) = pod_spec(plugin)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    pause = [e for e in own["matchExpressions"]
             if e["key"] == "nvidia.com/gpu.deploy.device-plugin"]
    assert pause and all(e in terms[0]["matchExpressions"] for e in pause)
