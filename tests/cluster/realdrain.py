"""The upgrade protocol's side of a test on the real control plane: a Node (and another) with
the GPU operator's deploy labels, the test's own namespace, the node agent running their pods,
the shipped upgrade-protocol policy enforced, and `ready` binding the role and making the
installer's pod-bound token (tests/cluster/test_dra.py, test_protocol.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from lib.apiproxy import ApiProxy
from lib.controlplane import ApiError, ControlPlane
from lib.nodeagent import NodeAgent
from lib.realcluster import RealNodes, apply_policies, real_nodes

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
    roles: list[str] = field(default_factory=list)  # ClusterRoles a test made: removed after

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
            claim = generated_claim(self, name)
        if driver is None:
            return
        allocate(self, claim, pod, driver, node)


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
            d = Drain(real, proxy, root, tmp_path / "kubeconfig", node, other, ns)
            try:
                yield d
            finally:
                # The namespace outlives the test (no namespace controller runs): its pods
                # go, or every later test's node agent and disruption controller see them.
                with contextlib.suppress(ApiError):
                    control_plane.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                          {"kind": "DeleteOptions", "apiVersion": "v1",
                                           "gracePeriodSeconds": 0})
                for role in d.roles:
                    with contextlib.suppress(ApiError):
                        control_plane.request(
                            "DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}")


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


# --- the host and the node's other actors, for the protocol's tests --------------------------

def hold(d: Drain, pid: int, comm: str, device: str = "/dev/nvidia0") -> None:
    """A process in the host's /proc with an open fd on `device` (what the installer reads to
    find the driver's holders)."""
    fd_dir = d.root / "proc" / str(pid) / "fd"
    fd_dir.mkdir(parents=True, exist_ok=True)
    (d.root / "proc" / str(pid) / "comm").write_text(comm + "\n")
    os.symlink(device, fd_dir / "3")


def exit_process(d: Drain, pid: int) -> None:
    shutil.rmtree(d.root / "proc" / str(pid), ignore_errors=True)


@contextlib.contextmanager
def exits_when_paused(d: Drain, pid: int, comm: str, label: str = PLUGIN) -> Iterator[None]:
    """What the DaemonSet controller and the kubelet do with the device plugin: its pod stops
    selecting the node once its deploy label is paused, and its process (holding /dev/nvidia0)
    goes. A watcher of the real Node, as the administrator."""
    hold(d, pid, comm)

    def watch(stop: threading.Event) -> None:
        while not stop.wait(0.05):
            with contextlib.suppress(ApiError, OSError):
                labels = d.real.get_node(d.node)["metadata"].get("labels") or {}
                if labels.get(label) == protocol.PAUSED:
                    exit_process(d, pid)
                    return

    with watching(watch):
        yield


def label_node(d: Drain, labels: dict[str, str | None], node: str | None = None) -> None:
    """An administrator's labels (None removes one)."""
    d.cp.request("PATCH", f"/api/v1/nodes/{node or d.node}", {"metadata": {"labels": labels}},
                 content_type="application/merge-patch+json")


def cordon(d: Drain) -> None:
    """`kubectl cordon`, as the administrator."""
    done = d.cp.apply("cordon", d.node)
    assert done.returncode == 0, done.stderr


def pod_with(d: Drain, name: str, *, node: str | None = None, gpus: int = 1,
             labels: dict[str, str] | None = None, finalizers: list[str] | None = None,
             owner: dict[str, object] | None = None,
             claim_template: str | None = None) -> dict:
    """A pod as Drain.gpu_pod makes it, with finalizers, a controller owner or a claim made
    from a ResourceClaimTemplate (as a DaemonSet's pod carries it)."""
    meta: dict = {"name": name, "labels": labels or {}}
    if finalizers:
        meta["finalizers"] = finalizers
    if owner:
        meta["ownerReferences"] = [owner]
    container: dict = {"name": "main", "image": "cuda"}
    spec: dict = {"nodeName": node or d.node, "containers": [container]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if claim_template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim_template}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return d.cp.create(f"/api/v1/namespaces/{d.ns}/pods", {"metadata": meta, "spec": spec})


def drop_finalizers(d: Drain, name: str) -> None:
    with contextlib.suppress(ApiError):  # already gone
        d.cp.request("PATCH", f"/api/v1/namespaces/{d.ns}/pods/{name}",
                     {"metadata": {"finalizers": None}},
                     content_type="application/merge-patch+json")


def pdb(d: Drain, name: str, selector: dict, *, namespace: str | None = None,
        min_available: int | None = None, max_unavailable: int | None = None,
        healthy: int) -> None:
    """A PodDisruptionBudget, waited for until the disruption controller has written its status
    for it (observedGeneration) with `healthy` pods counted."""
    ns = namespace or d.ns
    spec: dict = {"selector": {"matchLabels": selector} if selector else {}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    made = d.cp.create(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
                       {"metadata": {"name": name}, "spec": spec})
    deadline = time.monotonic() + 30
    while True:
        obj = d.cp.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}")
        status = obj.get("status") or {}
        if (status.get("observedGeneration") == made["metadata"]["generation"]
                and status.get("currentHealthy", 0) == healthy):
            return
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def healthy_pods(d: Drain, labels: dict[str, str]) -> int:
    """Pods with `labels` that are Ready and not terminating, as the server has them: what a
    budget protects."""
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    pods = d.cp.get(f"/api/v1/namespaces/{d.ns}/pods", query={"labelSelector": selector})
    return sum(1 for p in pods["items"] if not p["metadata"].get("deletionTimestamp")
               and any(c["type"] == "Ready" and c["status"] == "True"
                       for c in (p.get("status") or {}).get("conditions") or []))


def trimmed_rbac(d: Drain, directory: Path, tag: str,
                 keep: Callable[[list[dict]], list[dict]]) -> Path:
    """The shipped RBAC file with its ClusterRole renamed for this test (removed after it) and
    its rules passed through `keep` (rules -> rules)."""
    role = f"{tag}-{d.ns}"
    docs = [doc for doc in yaml.safe_load_all((PROTOCOL / "rbac.yaml").read_text()) if doc]
    for doc in docs:
        if doc["kind"] == "ClusterRole":
            doc["metadata"]["name"] = role
            doc["rules"] = keep(json.loads(json.dumps(doc["rules"])))
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] = role
    d.roles.append(role)
    path = directory / f"rbac-{tag}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def allocate(d: Drain, claim: str, pod: dict, driver: str, node: str | None = None) -> None:
    """The claim allocated by `driver` on `node` and reserved for `pod`, as the scheduler
    leaves it (Drain.dra_pod does the same for the pods it makes)."""
    node = node or d.node
    path = f"{RESOURCE}/namespaces/{d.ns}/resourceclaims/{claim}"
    current = d.cp.get(path)
    current["status"] = {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": driver,
                                                "pool": node, "device": "gpu-0"}]},
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                           "key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"],
                         "uid": pod["metadata"]["uid"]}]}
    d.cp.request("PUT", f"{path}/status", current)


def generated_claim(d: Drain, pod: str) -> str:
    """The name the resourceclaim controller gave the claim it made for the pod."""
    deadline = time.monotonic() + 30
    while True:
        statuses = d.cp.get(f"/api/v1/namespaces/{d.ns}/pods/{pod}").get(
            "status", {}).get("resourceClaimStatuses") or []
        if statuses and statuses[0].get("resourceClaimName"):
            return str(statuses[0]["resourceClaimName"])
        assert time.monotonic() < deadline, "the resourceclaim controller made no claim"
        time.sleep(0.1)


@contextlib.contextmanager
def watching(watch: Callable[[threading.Event], None]) -> Iterator[None]:
    """`watch(stop)` in a daemon thread while the block runs (an administrator or a controller
    acting beside the installer); on leaving, `stop` is set and the thread joined."""
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(10)
