"""Inside the guest of tests/vm/test_upgrade_protocol.py: the real control plane
(tests/lib/controlplane.py: etcd, kube-apiserver, controller manager, scheduler) with the one GPU
node the scenario upgrades, the shipped upgrade-protocol RBAC and admission policy, the
installer's pod-bound token and a kubeconfig through the recording proxy (tests/lib/apiproxy.py).
Until the scenario's end it plays the node's kubelet (tests/lib/nodeagent.py) and the DaemonSet
controller of NVIDIA's device plugin (once the node's label pauses the plugin, its pod is
deleted and its process, a real one in the guest, gets SIGTERM; H is touched once the installer
has told the server it waits for the driver's holders, which the scenario's plugin waits for
before it exits), and dumps on request what the test reads: the Node as the server stored it,
the Events about it and the installer's writes.

    python -m vm.guest_cluster --node N --label K=V ... --pod NS/NAME=GPUS ...
        --plugin-pid-file F --holders-seen H --kubeconfig K --ready R --dump D --dump-request Q

Writes the kubeconfig, then touches R once everything is up; each time Q appears it is removed
and D is written (atomically)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from lib import controlplane
from lib.apiproxy import ApiProxy
from lib.controlplane import INSTALLER_ACCOUNT, NAMESPACE_OF_INSTALLER, ApiError, ControlPlane
from lib.nodeagent import NodeAgent
from lib.realcluster import apply_policies

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = REPO / "daemonset" / "components" / "upgrade-protocol"
PAUSED = "paused-for-driver-upgrade"
DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
WAIT_SECONDS = 120.0
GUEST_START_TIMEOUT = 600.0


def _until(what: str, ok: Any) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not so after {WAIT_SECONDS:.0f} s")
        time.sleep(0.1)


def make_node(cp: ControlPlane, name: str, labels: dict[str, str], gpus: int) -> None:
    cp.node(name, labels=labels)
    # What NVIDIA's device plugin advertises: the GPU pods' requests fit the node.
    cp.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {
        "capacity": {"nvidia.com/gpu": str(gpus)}, "allocatable": {"nvidia.com/gpu": str(gpus)}}},
        content_type="application/strategic-merge-patch+json")


def make_pod(cp: ControlPlane, namespace: str, name: str, node: str, gpus: int) -> None:
    cp.namespace(namespace)
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    cp.create(f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "cuda",
                                                   "resources": resources}]}})


def allowed(cp: ControlPlane, verb: str, resource: str, namespace: str = "",
            group: str = "") -> bool:
    """Whether the server's RBAC authorizer (fed by an informer) already lets the installer's
    account do it: a SubjectAccessReview, as the administrator."""
    review = cp.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {"spec": {
        "user": f"system:serviceaccount:{NAMESPACE_OF_INSTALLER}:{INSTALLER_ACCOUNT}",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE_OF_INSTALLER}",
                   "system:authenticated"],
        "resourceAttributes": {"verb": verb, "resource": resource, "namespace": namespace,
                               "group": group}}})
    return bool(review["status"].get("allowed"))


def bind_shipped_rbac(cp: ControlPlane) -> None:
    """rbac.yaml applied as shipped (its bindings name the shipped account, which this
    server of the guest's own has), then waited for: every rule answers allowed."""
    done = cp.apply("apply", "--server-side", "--force-conflicts", "-f",
                    str(PROTOCOL / "rbac.yaml"))
    if done.returncode != 0:
        raise RuntimeError(f"kubectl apply rbac.yaml: {done.stderr}")
    for verb, resource, namespace, group in (
            ("patch", "nodes", "", ""), ("delete", "pods", "ml", ""),
            ("list", "poddisruptionbudgets", "ml", "policy"),
            ("get", "resourceclaims", "ml", "resource.k8s.io"),
            ("create", "events", "default", "")):
        _until(f"{verb} {resource} allowed",
               lambda v=verb, r=resource, n=namespace, g=group: allowed(cp, v, r, n, g))


def pods_running(cp: ControlPlane, node: str) -> bool:
    pods = cp.get("/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"})["items"]
    return all(p.get("status", {}).get("phase") == "Running" for p in pods)


class DevicePluginDaemonSet:
    """The DaemonSet controller and the kubelet for NVIDIA's device plugin: once the node's
    deploy label says paused, the node no longer matches the DaemonSet's affinity, so its pod
    is deleted and its process stopped (once per pause). How long a process takes to stop is
    not the DaemonSet's to say: the scenario's plugin holds the driver until `holders_seen`
    appears, touched here once the installer's WaitingForDriverHolders event is stored, so the
    installer is seen waiting for it however slow the guest is."""

    def __init__(self, cp: ControlPlane, node: str, pod: str, pid_file: Path,
                 holders_seen: Path) -> None:
        self.cp, self.node, self.pod, self.pid_file = cp, node, pod, pid_file
        self.holders_seen = holders_seen
        self.stopped = False

    def look(self) -> None:
        stored = self.cp.get(f"/api/v1/nodes/{self.node}")
        if self.stopped and not self.holders_seen.exists() and any(
                e["reason"] == "WaitingForDriverHolders"
                for e in node_events(self.cp, stored["metadata"]["uid"])):
            self.holders_seen.touch()
        labels = stored["metadata"].get("labels") or {}
        paused = labels.get(DEVICE_PLUGIN) == PAUSED
        if paused and not self.stopped:
            namespace, name = self.pod.split("/")
            with contextlib.suppress(ApiError):  # gone with an earlier pause
                self.cp.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
            with contextlib.suppress(ProcessLookupError, FileNotFoundError, ValueError):
                os.kill(int(self.pid_file.read_text()), signal.SIGTERM)
        self.stopped = paused


def node_events(cp: ControlPlane, uid: str) -> list[dict[str, Any]]:
    found = cp.get("/api/v1/namespaces/default/events",
                   query={"fieldSelector": f"involvedObject.uid={uid}"})["items"]
    return sorted(found, key=lambda e: int(e["metadata"]["resourceVersion"]))


def state(cp: ControlPlane, proxy: ApiProxy, node: str) -> dict[str, Any]:
    stored = cp.get(f"/api/v1/nodes/{node}")
    return {"node": stored,
            "events": [{"reason": e["reason"], "message": e["message"], "type": e["type"]}
                       for e in node_events(cp, stored["metadata"]["uid"])],
            # Every write the installer sent, whatever the answer: "METHOD path" (no query).
            "writes": [f"{w.method} {w.path.split('?')[0]}" for w in proxy.writes()]}


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True)
    parser.add_argument("--label", action="append", default=[], help="K=V on the Node")
    parser.add_argument("--gpus", type=int, default=8, help="the Node's nvidia.com/gpu")
    parser.add_argument("--pod", action="append", default=[], help="NS/NAME=GPUS on the Node")
    parser.add_argument("--device-plugin-pod", required=True, help="NS/NAME of the plugin's pod")
    parser.add_argument("--plugin-pid-file", type=Path, required=True)
    parser.add_argument("--holders-seen", type=Path, required=True,
                        help="touched once the installer reports waiting for the holders")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--dump", type=Path, required=True)
    parser.add_argument("--dump-request", type=Path, required=True)
    args = parser.parse_args()

    # A guest under TCG (one vCPU, the installer's first run beside it) takes minutes where
    # this machine takes seconds: the session's limit is for a loaded host.
    controlplane.START_TIMEOUT = GUEST_START_TIMEOUT
    began = time.monotonic()
    cp = controlplane.start()
    print(f"control plane up in {time.monotonic() - began:.0f} s", flush=True)
    try:
        labels = dict(item.split("=", 1) for item in args.label)
        make_node(cp, args.node, labels, args.gpus)
        for item in args.pod:
            pod, gpus = item.rsplit("=", 1)
            namespace, name = pod.split("/")
            make_pod(cp, namespace, name, args.node, int(gpus))
        apply_policies(cp, PROTOCOL / "admission-policy.yaml")
        bind_shipped_rbac(cp)
        token = cp.pod_token(args.node)
        plugin = DevicePluginDaemonSet(cp, args.node, args.device_plugin_pod,
                                       args.plugin_pid_file, args.holders_seen)
        with ApiProxy(cp, Path(tempfile.mkdtemp(prefix="proxy-tls-"))) as proxy, \
                NodeAgent(cp, {args.node}):
            proxy.kubeconfig(args.kubeconfig, token)
            _until("the node's pods Running", lambda: pods_running(cp, args.node))
            args.ready.touch()
            print(f"node, pods, policy, RBAC and token ready after "
                  f"{time.monotonic() - began:.0f} s", flush=True)
            while True:
                plugin.look()
                if args.dump_request.exists():
                    args.dump_request.unlink()
                    write_atomically(args.dump, json.dumps(state(cp, proxy, args.node),
                                                           indent=1, sort_keys=True))
                time.sleep(0.1)
    finally:
        cp.stop()


if __name__ == "__main__":
    main()
