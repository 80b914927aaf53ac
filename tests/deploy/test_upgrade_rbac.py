"""The DaemonSet side of the upgrade protocol: the base pod has no API rights at all (its
ServiceAccount, shared by the Components that need one, has nothing bound and no token mounted);
the protocol's least-privilege RBAC and admission policy come with components/upgrade-protocol
(pods deleted, never evicted: the policy can hold a DELETE to its own node, an Eviction not;
components/force-eviction grants nothing more); NODE_NAME from the downward API; the device
plugin leaving a node whose deploy label says paused-for-driver-upgrade; nodes pull prebuilt
modules read-only and a builder Job publishes."""

from __future__ import annotations

from typing import Any

import pytest
from lib.manifests import (
    DAEMONSET_DIR,
    SAMPLE_NODE_NAME,
    container_config,
    container_env,
    granted,
    installer_config,
    installer_container,
    installer_daemonset,
    load_all,
    pod_spec,
    render,
)

from installer.cluster import protocol
from installer.config import build_config, from_env

NAMESPACE = "kube-system"


def _kinds(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        found.setdefault(doc["kind"], []).append(doc)
    return found


@pytest.mark.parametrize("overlay", ["ubuntu", "rocky", "debian", "module-registry"])
def test_without_the_protocol_the_pod_has_no_api_identity(overlay: str) -> None:
    docs = render(DAEMONSET_DIR / "overlays" / overlay)
    # No RBAC, no policy: the ServiceAccount is there only for the Components to share (two
    # Components each shipping it would collide in kustomize), with nothing bound.
    assert {d["kind"] for d in docs} == {"DaemonSet", "ServiceAccount"}
    spec = pod_spec(installer_daemonset(docs))
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec
    config = installer_config(installer_daemonset(docs))
    assert config.upgrade_protocol is False
    assert config.node_name == SAMPLE_NODE_NAME  # to restore a node an earlier run left


def test_the_protocol_overlay_brings_identity_rbac_and_policy() -> None:
    docs = render(DAEMONSET_DIR / "overlays" / "upgrade-protocol")
    kinds = _kinds(docs)
    (account,) = kinds["ServiceAccount"]
    assert account["metadata"]["namespace"] == NAMESPACE
    ds = installer_daemonset(docs)
    spec = pod_spec(ds)
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is True
    subject = [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                "namespace": NAMESPACE}]
    for binding in kinds["ClusterRoleBinding"] + kinds["RoleBinding"]:
        assert binding["subjects"] == subject
    assert granted(docs) == {
        ("*", "", "nodes", "get"), ("*", "", "nodes", "patch"),
        ("*", "", "nodes", "list"),  # a pool policy's budget: the pool's nodes mid-upgrade
        ("*", "", "pods", "list"),
        ("*", "", "pods", "delete"),  # its own node's only: the admission policy
        ("*", "policy", "poddisruptionbudgets", "list"),  # checked before a delete
        ("*", "resource.k8s.io", "resourceclaims", "get"),  # GPU pods through DRA
        ("default", "", "events", "create"),  # Node events live in default: a Role there
    }
    assert not any(r.endswith("/eviction") for _, _, r, _ in granted(docs))
    assert all("*" not in str(rule) for d in docs if "rules" in d for rule in d["rules"])
    policies = {p["metadata"]["name"] for p in kinds["ValidatingAdmissionPolicy"]}
    bound = {b["spec"]["policyName"]: b["spec"]["validationActions"]
             for b in kinds["ValidatingAdmissionPolicyBinding"]}
    assert bound == {name: ["Deny"] for name in policies}
    container = installer_container(ds)
    (node_name,) = [e for e in container["env"] if e["name"] == "NODE_NAME"]
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    config = container_config(container)
    assert config.upgrade_protocol is True and config.force_eviction is False
    assert config.node_name == SAMPLE_NODE_NAME
    assert "device-plugin" in config.pause_components


def test_the_force_eviction_variant_grants_nothing_more() -> None:
    """Force eviction is the installer's decision to stop waiting for budgets, not a right."""
    docs = render(DAEMONSET_DIR / "examples" / "force-eviction")
    plain = granted(render(DAEMONSET_DIR / "overlays" / "upgrade-protocol"))
    assert granted(docs) == plain
    config = installer_config(installer_daemonset(docs))
    assert config.force_eviction is True and config.upgrade_protocol is True


def test_nodes_pull_read_only_and_trust_the_publisher_key() -> None:
    ds = installer_daemonset(render(DAEMONSET_DIR / "overlays" / "module-registry"))
    container = installer_container(ds)
    env = container_env(container)
    config = from_env(env)
    assert config.module_registry and not config.module_registry_push
    assert config.module_publisher_key is None  # nodes never hold the private key
    assert "NVIDIA_MODULE_REGISTRY_PASSWORD" not in env  # a file, not an environment variable
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(ds)["volumes"]}
    for setting in (config.module_trusted_keys, config.module_registry_password_file):
        assert setting is not None
        mount = mounts[str(setting.parent)]
        assert mount["readOnly"] is True
        assert "hostPath" not in volumes[mount["name"]]
    assert volumes["module-publisher"]["configMap"]["name"] == "nvidia-module-publisher"
    assert volumes["module-registry-pull"]["secret"]["secretName"] == \
        "nvidia-module-registry-pull"


def test_the_builder_job_publishes_signed_without_privileges() -> None:
    (job,) = load_all(DAEMONSET_DIR / "builder" / "prebuild-job.yaml")
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"][:1] == ["prebuild"] and "--push" in container["args"]
    config = build_config(container_env(container), {"module_registry_push": True,
                                                     "kernel_release": "6.8.0-1015-gcp"})
    assert config.module_publisher_key is not None and config.module_registry
    assert not container.get("securityContext", {}).get("privileged", False)
    assert spec["automountServiceAccountToken"] is False
    assert not any("hostPath" in v for v in spec["volumes"])
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "cloud.google.com/gke-accelerator", "operator": "DoesNotExist"} in \
        terms["nodeSelectorTerms"][0]["matchExpressions"]


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
