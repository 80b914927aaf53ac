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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from lib.apiproxy import ApiProxy
from lib.controlplane import ApiError, ControlPlane
from lib.nodeagent import NodeAgent

from cluster.realcluster import RealNodes, apply_policies, real_nodes
from installer.cluster import protocol
from installer.config import Config, build_config
from installer.errors import ClusterApiForbidden
from installer.hostroot import HostRoot
from installer.layout import Layout

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = REPO / "daemonset" / "components" / "upgrade-protocol"
PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
DRA_PLUGIN = "nvidia.com/gpu.deploy.dra-driver"
RESOURCE = "/apis/resource.k8s.io/v1"
_tests = iter(range(1_000_000))


@dataclass
class Drain:
    real: RealNodes
    proxy: ApiProxy
    root: Path
    kubeconfig: Path
    node: str
    other: str
    ns: str  # the test's own namespace: the server outlives the test

    @property
    def cp(self) -> ControlPlane:
        return self.real.cp

    def config(self, **env: str) -> Config:
        return build_config({"NVIDIA_INSTALLER_UPGRADE_PROTOCOL": "true",
                             "NODE_NAME": self.node,
                             "NVIDIA_INSTALLER_KUBECONFIG": str(self.kubeconfig),
                             "ROOT_MOUNT_DIR": str(self.root),
                             "NVIDIA_INSTALL_DIR_CONTAINER": str(self.root / "no-mount"),
                             "NVIDIA_INSTALLER_EVICTION_TIMEOUT": "60",
                             "NVIDIA_INSTALLER_HOLDERS_TIMEOUT": "30", **env}, {})

    def make_room(self, config: Config) -> None:
        layout = Layout.from_config(config, HostRoot(config.root))
        layout.install_local.mkdir(parents=True, exist_ok=True)
        protocol.make_room(config, HostRoot(config.root), layout, "580.105.08", "580.126.20")

    def pods(self) -> set[str]:
        return {p["metadata"]["name"] for p in
                self.cp.get(f"/api/v1/namespaces/{self.ns}/pods")["items"]}

    def dra_pod(self, name: str, driver: str | None, *, template: bool = False,
                node: str | None = None) -> None:
        """A pod holding one claim, allocated by `driver` (None: still pending) and reserved
        for the pod, as the scheduler and the resourceclaim controller leave it."""
        node = node or self.node
        request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
        if template:
            self.cp.create(f"{RESOURCE}/namespaces/{self.ns}/resourceclaimtemplates", {
                "metadata": {"name": f"{name}-template"},
                "spec": {"spec": {"devices": {"requests": [request]}}}})
            entry = {"name": "gpu", "resourceClaimTemplateName": f"{name}-template"}
        else:
            self.cp.create(f"{RESOURCE}/namespaces/{self.ns}/resourceclaims", {
                "metadata": {"name": f"{name}-gpu"},
                "spec": {"devices": {"requests": [request]}}})
            entry = {"name": "gpu", "resourceClaimName": f"{name}-gpu"}
        pod = self.cp.create(f"/api/v1/namespaces/{self.ns}/pods", {
            "metadata": {"name": name},
            "spec": {"nodeName": node, "resourceClaims": [entry],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}})
        claim = f"{name}-gpu"
        if template:  # the resourceclaim controller makes the claim and names it in the pod
            deadline = time.monotonic() + 30
            while True:
                statuses = self.cp.get(f"/api/v1/namespaces/{self.ns}/pods/{name}").get(
                    "status", {}).get("resourceClaimStatuses") or []
                if statuses and statuses[0].get("resourceClaimName"):
                    claim = statuses[0]["resourceClaimName"]
                    break
                assert time.monotonic() < deadline, "the resourceclaim controller made no claim"
                time.sleep(0.1)
        if driver is None:
            return
        path = f"{RESOURCE}/namespaces/{self.ns}/resourceclaims/{claim}"
        current = self.cp.get(path)
        current["status"] = {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": driver,
                                                    "pool": node, "device": "gpu-0"}]},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                               "key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": name,
                             "uid": pod["metadata"]["uid"]}]}
        self.cp.request("PUT", f"{path}/status", current)


@pytest.fixture
def drain(control_plane: ControlPlane, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Drain]:
    monkeypatch.setattr(protocol, "POLL_SECONDS", 0.1)
    n = next(_tests)
    with real_nodes(control_plane, tmp_path) as (real, proxy):
        apply_policies(control_plane, PROTOCOL / "admission-policy.yaml")
        node, other = f"dra-{n}-node-1", f"dra-{n}-node-2"
        labels = {PLUGIN: "true", DRA_PLUGIN: "true"}
        real.node(node, labels=labels)
        real.node(other, labels=labels)
        ns = control_plane.namespace(f"dra-{n}")
        root = tmp_path / "host"
        (root / "proc").mkdir(parents=True)
        with NodeAgent(control_plane, {node, other}):
            yield Drain(real, proxy, root, tmp_path / "kubeconfig", node, other, ns)


def ready(d: Drain, rbac: Path | None = None) -> Config:
    """The role bound (as shipped, or `rbac`), the token made, the pods Running."""
    d.real.bind(rbac or PROTOCOL / "rbac.yaml")
    d.real.wait_allowed("list", "pods")
    d.proxy.kubeconfig(d.kubeconfig, d.real.token(d.node))
    deadline = time.monotonic() + 30
    while any(p.get("status", {}).get("phase") != "Running" for p in
              d.cp.get(f"/api/v1/namespaces/{d.ns}/pods")["items"]):
        assert time.monotonic() < deadline, "the node agent never ran the pods"
        time.sleep(0.1)
    return d.config()


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

