"""The upgrade protocol with GPU clients through Dynamic Resource Allocation, against the
stand-in API server (the shipped upgrade-protocol RBAC and policy enforced): a pod holding a
ResourceClaim allocated by gpu.nvidia.com or compute-domain.nvidia.com, named directly or made
from a template, is drained like a pod requesting nvidia.com/gpu; a claim of another driver, or
one not allocated yet, is not a GPU client; NVIDIA's DRA kubelet plugin (its deploy label) is
paused only once the claim-holding pods are gone, since the kubelet needs it to unprepare their
devices, and restored with the other labels."""

from __future__ import annotations

import pytest

from cluster.apiserver import Cluster, cluster_role_rules
from cluster.nodes import NODE, PAUSED, PLUGIN, RBAC, Env, make_room
from installer.cluster import dra, protocol

DRA_PLUGIN = "nvidia.com/gpu.deploy.dra-driver"


def dra_pod(env: Env, namespace: str, name: str, driver: str | None, *,
            template: bool = False, node: str = NODE) -> None:
    pod = env.cluster.add_pod(namespace, name, node)
    env.cluster.add_claim(namespace, f"{name}-gpu", pod, driver,
                          template="gpu-template" if template else None)


def test_pods_holding_nvidia_claims_are_drained_and_others_stay(env: Env) -> None:
    env.cluster.nodes[NODE]["metadata"]["labels"][DRA_PLUGIN] = "true"
    dra_pod(env, "ml", "direct", "gpu.nvidia.com")
    dra_pod(env, "ml", "templated", "gpu.nvidia.com", template=True)
    dra_pod(env, "hpc", "imex", "compute-domain.nvidia.com")
    dra_pod(env, "ml", "fpga", "fpga.example.com")
    dra_pod(env, "ml", "pending", None)
    dra_pod(env, "ml", "elsewhere", "gpu.nvidia.com", node="gpu-node-2")
    config = env.config()

    make_room(env, config)

    left = set(env.cluster.pods)
    assert not {("ml", "direct"), ("ml", "templated"), ("hpc", "imex")} & left
    assert {("ml", "fpga"), ("ml", "pending"), ("ml", "elsewhere")} <= left
    deleted = sorted(r.path for r in env.cluster.requests if r.method == "DELETE")
    assert deleted == ["/api/v1/namespaces/hpc/pods/imex", "/api/v1/namespaces/ml/pods/direct",
                       "/api/v1/namespaces/ml/pods/templated"]
    # Claims are read by name, in the pod's namespace, never listed across the cluster.
    reads = {r.path for r in env.cluster.requests if "resourceclaims" in r.path}
    assert "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/templated-gpu" in reads
    assert all("/namespaces/" in path for path in reads)


@pytest.mark.parametrize("served, used", [
    (("v1beta1",), "v1beta1"),  # Kubernetes 1.32
    (("v1beta2", "v1beta1"), "v1beta2"),  # 1.33
    (("v1", "v1beta2", "v1beta1"), "v1"),  # 1.34
])
def test_claims_are_read_through_the_version_the_cluster_serves(
        env: Env, served: tuple[str, ...], used: str) -> None:
    env.cluster.resource_versions = served
    dra_pod(env, "ml", "train", "gpu.nvidia.com")
    dra_pod(env, "hpc", "imex", "compute-domain.nvidia.com", template=True)

    make_room(env, env.config())

    assert not {("ml", "train"), ("hpc", "imex")} & set(env.cluster.pods)
    reads = [r for r in env.cluster.requests if "resourceclaims" in r.path]
    assert reads and all(r.path.startswith(f"/apis/resource.k8s.io/{used}/") for r in reads)
    assert [r.path for r in env.cluster.requests].count("/apis/resource.k8s.io") == 1


def test_a_cluster_without_dra_has_no_claim_pods(env: Env) -> None:
    env.cluster.resource_versions = ()
    dra_pod(env, "ml", "named", None)  # a claim name the pod carries, served by no group
    make_room(env, env.config())
    assert ("ml", "named") in env.cluster.pods
    assert not [r for r in env.cluster.requests if "resourceclaims" in r.path]


def test_compute_domain_daemon_pods_are_waited_for_never_evicted(env: Env) -> None:
    """The DRA driver runs a ComputeDomain's IMEX daemon as a DaemonSet of its own, each pod
    holding a compute-domain.nvidia.com claim: deleting it would only bring it straight back,
    so it is a GPU client that is waited for (it leaves once the workload's pods are gone and
    the DaemonSet stops selecting the node), never deleted, not even by force."""
    from installer.errors import EvictionTimeout

    pod = env.cluster.add_pod("nvidia-dra-driver-gpu", "cd-daemon-x1", NODE,
                              owner_kind="DaemonSet")
    env.cluster.add_claim("nvidia-dra-driver-gpu", "cd-daemon-x1-daemon", pod,
                          "compute-domain.nvidia.com", template="cd-daemon-template")
    config = env.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="1",
                        NVIDIA_INSTALLER_FORCE_EVICTION="true")
    with pytest.raises(EvictionTimeout, match=r"nvidia-dra-driver-gpu/cd-daemon-x1 "
                       r"\(DaemonSet pod"):
        make_room(env, config)
    assert ("nvidia-dra-driver-gpu", "cd-daemon-x1") in env.cluster.pods
    assert not [r for r in env.cluster.requests if r.method == "DELETE"]
    assert "GpuPodNotEvicted" in [reason for reason, _ in env.events()]


def test_the_dra_plugin_is_paused_only_after_the_claim_pods_are_gone(env: Env) -> None:
    env.cluster.nodes[NODE]["metadata"]["labels"][DRA_PLUGIN] = "true"
    dra_pod(env, "ml", "train", "gpu.nvidia.com")
    seen: list[tuple[str | None, bool]] = []

    def watch(cluster: Cluster, node: dict) -> None:
        labels = node["metadata"]["labels"]
        seen.append((labels.get(DRA_PLUGIN), ("ml", "train") in cluster.pods))

    env.cluster.on_node_change.append(watch)
    config = env.config()
    before = env.node()["metadata"]["labels"]

    make_room(env, config)

    labels = env.node()["metadata"]["labels"]
    assert labels[DRA_PLUGIN] == PAUSED and labels[PLUGIN] == PAUSED
    # While the pod existed the plugin's label stayed on; it went to paused once it was gone.
    assert all(value == "true" for value, pod_there in seen if pod_there)
    assert (PAUSED, False) in seen
    assert "DraPluginPaused" in [reason for reason, _ in env.events()]

    protocol.finish(config, env.layout(config))
    assert env.node()["metadata"]["labels"] == {**before,
                                                protocol.STATE_LABEL: "upgrade-done"}


def test_without_the_claims_grant_the_protocol_is_refused_and_the_node_restored(
        env: Env) -> None:
    import pytest

    from installer.errors import ClusterApiForbidden

    env.cluster.rules = [rule for rule in cluster_role_rules(RBAC)
                         if "resourceclaims" not in rule.get("resources", [])]
    dra_pod(env, "ml", "train", "gpu.nvidia.com")
    with pytest.raises(ClusterApiForbidden, match="resourceclaims"):
        make_room(env, env.config())
    assert ("ml", "train") in env.cluster.pods
    assert "unschedulable" not in env.node()["spec"]


def test_claim_names_and_drivers() -> None:
    pod = {"spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "shared"},
                                       {"name": "b", "resourceClaimTemplateName": "t"}]},
           "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"},
                                                {"name": "c"}]}}
    assert dra.claim_names(pod) == ["shared", "p-b-x1"]
    assert dra.allocated_by_nvidia({"status": {"allocation": {"devices": {"results": [
        {"driver": "fpga.example.com"}, {"driver": "gpu.nvidia.com"}]}}}}) == "gpu.nvidia.com"
    assert dra.allocated_by_nvidia({"status": {}}) is None
