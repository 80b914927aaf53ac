"""The DaemonSet side of the upgrade protocol (issue 13): service account, least-privilege RBAC,
NODE_NAME from the downward API, the protocol switched on, and the device plugin leaving a node
whose deploy label says paused-for-driver-upgrade."""

from __future__ import annotations

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
from installer.cluster import protocol
from installer.config import from_env

NAMESPACE = "kube-system"


def _kinds(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


@pytest.mark.parametrize("overlay", ["ubuntu", "rocky"])
def test_overlays_ship_the_service_account_and_its_binding(overlay: str) -> None:
    docs = render(DAEMONSET_DIR / "overlays" / overlay)
    kinds = _kinds(docs)
    account = kinds["ServiceAccount"]
    assert account["metadata"]["namespace"] == NAMESPACE
    ds = installer_daemonset(docs)
    assert pod_spec(ds)["serviceAccountName"] == account["metadata"]["name"]
    binding = kinds["ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole",
                                  "name": kinds["ClusterRole"]["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": account["metadata"]["name"],
                                    "namespace": NAMESPACE}]


def test_cluster_role_grants_only_what_the_protocol_calls() -> None:
    role = _kinds(load_all(DAEMONSET_DIR / "base" / "rbac.yaml"))["ClusterRole"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    # tests/cluster enforces these rules in the stand-in API server, so none can be missing.
    assert granted == {
        ("", "nodes", "get"), ("", "nodes", "patch"),
        ("", "pods", "list"), ("", "pods", "delete"),
        ("", "pods/eviction", "create"),
        ("", "events", "create"),
    }
    assert all("*" not in str(rule) for rule in role["rules"])


def test_installer_runs_the_protocol_with_its_node_name() -> None:
    ds = installer_daemonset(load_all(DAEMONSET_DIR / "base" / "daemonset.yaml"))
    container = installer_container(ds)
    (node_name,) = [e for e in container["env"] if e["name"] == "NODE_NAME"]
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    config = from_env(container_env(container))
    assert config.upgrade_protocol is True
    assert config.node_name == SAMPLE_NODE_NAME
    assert "device-plugin" in config.pause_components


def _selected(term: dict[str, Any], labels: dict[str, str]) -> bool:
    """Node affinity semantics of the operators used (Exists, In, NotIn: absent matches)."""
    for expr in term["matchExpressions"]:
        value = labels.get(expr["key"])
        op = expr["operator"]
        if (op == "Exists" and value is None) or (op == "In" and value not in expr["values"]) \
                or (op == "NotIn" and value in expr["values"]):
            return False
    return True


@pytest.mark.parametrize(("labels", "runs"), [
    ({}, True),
    ({"nvidia.com/gpu.deploy.device-plugin": "true"}, True),
    ({"nvidia.com/gpu.deploy.device-plugin": protocol.PAUSED}, False),
])
def test_device_plugin_leaves_a_node_paused_for_driver_upgrade(labels: dict[str, str],
                                                               runs: bool) -> None:
    (plugin,) = load_all(DAEMONSET_DIR / "extras" / "device-plugin.yaml")
    (term,) = pod_spec(plugin)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    node = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
            "kubernetes.io/arch": "amd64", **labels}
    assert _selected(term, node) is runs
    assert "device-plugin" in from_env({}).pause_components
