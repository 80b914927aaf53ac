"""The upgrade protocol's side of a test on the real control plane: a Node (and another) with
the GPU operator's deploy labels, the test's own namespace, the node agent running their pods,
the shipped upgrade-protocol policy enforced, and `ready` binding the role and making the
installer's pod-bound token (tests/cluster/test_dra_real.py, test_protocol_real.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lib.apiproxy import ApiProxy
from lib.controlplane import ControlPlane
from lib.nodeagent import NodeAgent

from cluster.realcluster import RealNodes, apply_policies, real_nodes
from installer.cluster import protocol
from installer.config import Config, build_config
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

    def gpu_pod(self, name: str, *, node: str | None = None, gpus: int = 1,
                labels: dict[str, str] | None = None) -> None:
        """A pod bound to `node` asking for nvidia.com/gpu (the node agent runs it)."""
        self.cp.create(f"/api/v1/namespaces/{self.ns}/pods", {
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"nodeName": node or self.node, "containers": [{
                "name": "main", "image": "cuda",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}]}})

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
    monkeypatch.setattr("installer.cluster.drain.POLL_SECONDS", 0.1)
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
