"""The upgrade protocol's drain with GPU clients through Dynamic Resource Allocation, against a
real kube-apiserver (tests/lib/controlplane.py) with the shipped upgrade-protocol RBAC and
policy, the installer's token bound to a Pod on its Node: real ResourceClaims (named directly,
or generated from a ResourceClaimTemplate by kube-controller-manager's resourceclaim
controller), allocated as the scheduler leaves them, on pods the node agent
(tests/lib/nodeagent.py) runs and finishes deleting as a kubelet would. A pod holding a claim
allocated by gpu.nvidia.com or compute-domain.nvidia.com is drained; a claim of another driver,
or one not allocated, is not a GPU client; NVIDIA's DRA kubelet plugin is paused only once the
claim-holding pods are gone. (tests/cluster/test_dra.py keeps, on the stand-in, what a 1.36
server cannot show: clusters serving only the beta versions, or no resource.k8s.io.)"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
import yaml
from lib.controlplane import ApiError

from cluster.realdrain import DRA_PLUGIN, PLUGIN, PROTOCOL, RESOURCE, Drain, drain, ready
from installer.cluster import protocol
from installer.errors import ClusterApiForbidden
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
    stop = threading.Event()

    def sample() -> None:
        # The label first, then the pod: a pod gone when the label was read stays gone.
        while not stop.is_set():
            label = drain.real.get_node(drain.node)["metadata"]["labels"].get(DRA_PLUGIN)
            seen.append((label, "train" in drain.pods()))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        drain.make_room(config)
    finally:
        stop.set()
        sampler.join(10)
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
    docs = [d for d in yaml.safe_load_all((PROTOCOL / "rbac.yaml").read_text()) if d]
    for doc in docs:
        if doc["kind"] == "ClusterRole":
            doc["metadata"]["name"] = f"no-claims-{drain.ns}"
            doc["rules"] = [r for r in doc["rules"] if "resourceclaims" not in r["resources"]]
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] = f"no-claims-{drain.ns}"
    rbac = tmp_path / "rbac-without-claims.yaml"
    rbac.write_text(yaml.safe_dump_all(docs))
    drain.dra_pod("train", "gpu.nvidia.com")
    config = ready(drain, rbac)
    with pytest.raises(ClusterApiForbidden, match="resourceclaims"):
        drain.make_room(config)
    assert "train" in drain.pods()
    assert "unschedulable" not in drain.real.get_node(drain.node)["spec"]
    with contextlib.suppress(ApiError):
        drain.cp.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/"
                         f"no-claims-{drain.ns}")

