"""The upgrade protocol's drain with GPU clients through Dynamic Resource Allocation, against a
real kube-apiserver (tests/lib/controlplane.py) with the shipped upgrade-protocol RBAC and
policy, the installer's token bound to a Pod on its Node: real ResourceClaims (named directly,
or generated from a ResourceClaimTemplate by kube-controller-manager's resourceclaim
controller), allocated as the scheduler leaves them, on pods the node agent
(tests/lib/nodeagent.py) runs and finishes deleting as a kubelet would. A pod holding a claim
allocated by gpu.nvidia.com or compute-domain.nvidia.com is drained; a claim of another driver,
or one not allocated, is not a GPU client; NVIDIA's DRA kubelet plugin is paused only once the
claim-holding pods are gone. A ComputeDomain's daemon (a DaemonSet's pod, made by the real
DaemonSet controller) is waited for, never deleted. A cluster without resource.k8s.io is one
whose discovery answers 404 (the proxy answers so)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cluster.realdrain import (
    DRA_PLUGIN,
    PLUGIN,
    RESOURCE,
    Drain,
    allocate,
    drain,
    generated_claim,
    ready,
    trimmed_rbac,
    watching,
)
from installer.cluster import dra, protocol
from installer.errors import ClusterApiForbidden, EvictionTimeout
from installer.hostroot import HostRoot
from installer.layout import Layout

__all__ = ["drain"]  # the fixture, imported for pytest


def test_pods_holding_nvidia_claims_are_drained_and_others_stay(drain: Drain) -> None:
    drain.dra_pod("direct", "gpu.nvidia.com")
    drain.dra_pod("templated", "gpu.nvidia.com", template=True)
    drain.dra_pod("imex", "compute-domain.nvidia.com")
    drain.dra_pod("fpga", "fpga.example.com")
    drain.dra_pod("pending", None)
    drain.dra_pod("elsewhere", "gpu.nvidia.com", node=drain.other)
    config = ready(drain)

    drain.make_room(config)

    assert drain.pods() == {"fpga", "pending", "elsewhere"}
    deleted = sorted(s.path.split("?")[0] for s in drain.proxy.writes() if s.method == "DELETE")
    assert deleted == [f"/api/v1/namespaces/{drain.ns}/pods/{p}"
                       for p in ("direct", "imex", "templated")]
    # Claims are read by name, in the pod's namespace, never listed across the cluster.
    reads = {s.path.split("?")[0] for s in drain.proxy.seen if "resourceclaims" in s.path}
    assert all(f"/namespaces/{drain.ns}/resourceclaims/" in p for p in reads)
    assert any(p.startswith(f"{RESOURCE}/namespaces/{drain.ns}/resourceclaims/templated-gpu-")
               for p in reads)
    node = drain.real.get_node(drain.node)
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"][DRA_PLUGIN] == protocol.PAUSED


def test_the_dra_plugin_is_paused_only_after_the_claim_pods_are_gone(drain: Drain) -> None:
    drain.dra_pod("train", "gpu.nvidia.com")
    config = ready(drain)
    before = drain.real.get_node(drain.node)["metadata"]["labels"]
    seen: list[tuple[str | None, bool]] = []

    def sample(stop: threading.Event) -> None:
        # The label first, then the pod: a pod gone when the label was read stays gone.
        while not stop.is_set():
            label = drain.real.get_node(drain.node)["metadata"]["labels"].get(DRA_PLUGIN)
            seen.append((label, "train" in drain.pods()))
            time.sleep(0.02)

    with watching(sample):
        drain.make_room(config)
    assert ("true", True) in seen
    assert (protocol.PAUSED, True) not in seen
    labels = drain.real.get_node(drain.node)["metadata"]["labels"]
    assert labels[DRA_PLUGIN] == labels[PLUGIN] == protocol.PAUSED
    events = [e["reason"] for e in drain.real.events(drain.node)]
    assert "DraPluginPaused" in events and "GpuPodEvicted" in events

    protocol.finish(config, Layout.from_config(config, HostRoot(config.root)))
    assert drain.real.get_node(drain.node)["metadata"]["labels"] == {
        **before, protocol.STATE_LABEL: "upgrade-done"}


def test_without_the_claims_grant_the_protocol_is_refused_and_the_node_restored(
        drain: Drain, tmp_path: Path) -> None:
    def without_claims(rules: list[dict]) -> list[dict]:
        return [r for r in rules if "resourceclaims" not in r["resources"]]

    drain.dra_pod("train", "gpu.nvidia.com")
    config = ready(drain, trimmed_rbac(drain, tmp_path, "no-claims", without_claims))
    with pytest.raises(ClusterApiForbidden, match="resourceclaims"):
        drain.make_room(config)
    assert "train" in drain.pods()
    assert "unschedulable" not in drain.real.get_node(drain.node)["spec"]


@pytest.mark.parametrize("served, used", [
    (("v1beta1",), "v1beta1"),  # Kubernetes 1.32
    (("v1beta2", "v1beta1"), "v1beta2"),  # 1.33
    (None, "v1"),  # this server (1.36) as it answers: v1, v1beta2, v1beta1
])
def test_claims_are_read_through_the_version_the_cluster_serves(
        drain: Drain, served: tuple[str, ...] | None, used: str) -> None:
    """The installer asks the group once which versions it serves and reads every claim
    through the newest it knows. An older cluster's discovery is the proxy's answer; the
    claims are read from the real server through that version (it serves the beta versions
    too: tests/lib/controlplane.py's RUNTIME_CONFIG)."""
    drain.dra_pod("train", "gpu.nvidia.com")
    drain.dra_pod("imex", "compute-domain.nvidia.com", template=True)
    config = ready(drain)
    if served is not None:
        drain.proxy.answer("GET", r"/apis/resource\.k8s\.io$", 200, {
            "kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io",
            "versions": [{"groupVersion": f"resource.k8s.io/{v}", "version": v}
                         for v in served],
            "preferredVersion": {"groupVersion": f"resource.k8s.io/{served[0]}",
                                 "version": served[0]}}, times=1000)

    drain.make_room(config)

    assert drain.pods() == set()
    reads = [s for s in drain.proxy.seen if "resourceclaims" in s.path]
    assert reads and all(s.status == 200 for s in reads)
    assert all(s.path.startswith(f"/apis/resource.k8s.io/{used}/namespaces/{drain.ns}/"
                                 "resourceclaims/") for s in reads)
    assert [s.path for s in drain.proxy.seen].count("/apis/resource.k8s.io") == 1


def test_a_cluster_without_dra_has_no_claim_pods(drain: Drain) -> None:
    """A cluster that serves no resource.k8s.io answers its discovery with 404 (the proxy
    answers so, for every ask): the claim a pod names is never read, the pod is no GPU
    client and stays."""
    drain.dra_pod("named", None)  # a claim name the pod carries, not allocated
    config = ready(drain)
    drain.proxy.fail("GET", r"/apis/resource\.k8s\.io$", 404, times=1000)
    drain.make_room(config)
    assert drain.pods() == {"named"}
    assert [s.status for s in drain.proxy.seen if s.path == "/apis/resource.k8s.io"] == [404]
    assert not [s for s in drain.proxy.seen if "resourceclaims" in s.path]


def test_compute_domain_daemon_pods_are_waited_for_never_evicted(drain: Drain) -> None:
    """The DRA driver runs a ComputeDomain's IMEX daemon as a DaemonSet of its own, each pod
    holding a compute-domain.nvidia.com claim: deleting it would only bring it straight back,
    so it is a GPU client that is waited for (it leaves once the workload's pods are gone and
    the DaemonSet stops selecting the node), never deleted, not even by force. Here the real
    DaemonSet controller makes the pod (on this node by the template's nodeName) and the
    resourceclaim controller its claim."""
    drain.cp.create(f"{RESOURCE}/namespaces/{drain.ns}/resourceclaimtemplates", {
        "metadata": {"name": "cd-daemon"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "compute-domain.nvidia.com"}}]}}}})
    daemonsets = f"/apis/apps/v1/namespaces/{drain.ns}/daemonsets"
    drain.cp.create(daemonsets, {
        "metadata": {"name": "cd-daemon"},
        "spec": {"selector": {"matchLabels": {"app": "cd-daemon"}},
                 "updateStrategy": {"type": "OnDelete"},
                 "template": {"metadata": {"labels": {"app": "cd-daemon"}}, "spec": {
                     "nodeName": drain.node,
                     # The node carries the not-ready taint the server gives a new Node (no
                     # kubelet here clears it); the driver's daemons tolerate it.
                     "tolerations": [{"key": "node.kubernetes.io/not-ready",
                                      "operator": "Exists", "effect": "NoSchedule"}],
                     "resourceClaims": [{"name": "gpu",
                                         "resourceClaimTemplateName": "cd-daemon"}],
                     "containers": [{"name": "imex", "image": "imex",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}}})
    try:
        deadline = time.monotonic() + 30
        while not (made := drain.cp.get(f"/api/v1/namespaces/{drain.ns}/pods")["items"]):
            assert time.monotonic() < deadline, "the DaemonSet controller made no pod"
            time.sleep(0.1)
        (pod,) = made
        name = pod["metadata"]["name"]
        allocate(drain, generated_claim(drain, name), pod, "compute-domain.nvidia.com")
        ready(drain)
        config = drain.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="1",
                              NVIDIA_INSTALLER_FORCE_EVICTION="true")
        with pytest.raises(EvictionTimeout, match=rf"{drain.ns}/{name} \(DaemonSet pod"):
            drain.make_room(config)
        assert drain.pods() == {name}
        assert not [s for s in drain.proxy.writes() if s.method == "DELETE"]
        events = [e["reason"] for e in drain.real.events(drain.node)]
        assert "GpuPodNotEvicted" in events
    finally:
        drain.cp.request("DELETE", f"{daemonsets}/cd-daemon", {
            "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})


def test_claim_names_and_drivers() -> None:
    pod = {"spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "shared"},
                                       {"name": "b", "resourceClaimTemplateName": "t"}]},
           "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"},
                                                {"name": "c"}]}}
    assert dra.claim_names(pod) == ["shared", "p-b-x1"]
    assert dra.allocated_by_nvidia({"status": {"allocation": {"devices": {"results": [
        {"driver": "fpga.example.com"}, {"driver": "gpu.nvidia.com"}]}}}}) == "gpu.nvidia.com"
    assert dra.allocated_by_nvidia({"status": {}}) is None
