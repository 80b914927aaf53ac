"""A minimal node agent: what a kubelet does to the API for Nodes that have none (the real
control plane of tests/lib/controlplane.py runs no kubelet; docs/testing.md says why this and
not kwok). For the nodes it is given it

- renews the node's Lease in kube-node-lease (the node lifecycle controller's heartbeat),
- turns each pod bound to them Running and Ready (status written through pods/status),
- finishes a pod's deletion as the kubelet does: after the pod's containers stop (at once, or
  after `stop_seconds` if shorter than the grace period), a DELETE with grace period 0 and the
  pod's uid as precondition.

It writes with the administrator's credentials, not a node's: NodeRestriction and the Node
authorizer are the kubelet's concern, not the installer's."""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from typing import Any

from lib.controlplane import ApiError, ControlPlane

LEASE_SECONDS = 40  # the kubelet's default lease duration
RENEW_SECONDS = 10  # the kubelet renews at a quarter of it


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _micro(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str) -> datetime.datetime:
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)


class NodeAgent:
    def __init__(self, cp: ControlPlane, nodes: set[str], *, stop_seconds: float = 0.0,
                 poll: float = 0.2) -> None:
        self.cp, self.nodes, self.stop_seconds, self.poll = cp, set(nodes), stop_seconds, poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-agent", daemon=True)
        self._renewed = 0.0
        self.errors: list[str] = []

    def __enter__(self) -> NodeAgent:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if time.monotonic() - self._renewed >= RENEW_SECONDS:
                    for node in sorted(self.nodes):
                        self._renew(node)
                    self._renewed = time.monotonic()
                for pod in self.cp.get("/api/v1/pods")["items"]:
                    if pod["spec"].get("nodeName") in self.nodes:
                        self._tend(pod)
            except (ApiError, OSError) as e:  # a test's fault, or the server stopping
                self.errors.append(str(e))
            self._stop.wait(self.poll)

    def _renew(self, node: str) -> None:
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        spec = {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": _micro(_now())}
        try:
            self.cp.request("PATCH", f"{path}/{node}", {"spec": spec},
                            content_type="application/merge-patch+json")
        except ApiError as e:
            if e.status != 404:
                raise
            self.cp.create(path, {"metadata": {"name": node}, "spec": spec})

    def _tend(self, pod: dict[str, Any]) -> None:
        meta, status = pod["metadata"], pod.get("status", {})
        ns, name = meta["namespace"], meta["name"]
        if "deletionTimestamp" in meta:
            grace = int(meta.get("deletionGracePeriodSeconds") or 0)
            began = _parse(meta["deletionTimestamp"]) - datetime.timedelta(seconds=grace)
            if _now() >= began + datetime.timedelta(seconds=min(grace, self.stop_seconds)):
                with contextlib.suppress(ApiError):  # already gone
                    self.cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {
                        "kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                        "preconditions": {"uid": meta["uid"]}})
            return
        if status.get("phase") in ("Running", "Succeeded", "Failed"):
            return
        now = _now().strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = [{"type": t, "status": "True", "lastTransitionTime": now}
                      for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady",
                                "Ready", "PodScheduled")]
        containers = [{"name": c["name"], "image": c["image"], "imageID": "",
                       "ready": True, "started": True, "restartCount": 0,
                       "state": {"running": {"startedAt": now}}}
                      for c in pod["spec"]["containers"]]
        with contextlib.suppress(ApiError):  # deleted or changed meanwhile: next round
            self.cp.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", {
                "status": {"phase": "Running", "conditions": conditions,
                           "containerStatuses": containers, "hostIP": "127.0.0.1",
                           "podIP": "127.0.0.1", "startTime": now}},
                content_type="application/strategic-merge-patch+json")
