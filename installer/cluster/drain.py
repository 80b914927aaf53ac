"""Emptying a node of the driver's users: evict the pods that use a GPU (as an eviction would,
within their PodDisruptionBudgets), wait for the pods that cannot be evicted, then for every
process holding /dev/nvidia* to close it. The upgrade protocol (installer.cluster.protocol)
calls it between pausing the GPU clients and unloading the driver."""

from __future__ import annotations

import logging
import time

from installer import host
from installer.cluster import disruption, dra
from installer.cluster.client import Json, NodeClient
from installer.config import Config
from installer.errors import DriverHoldersTimeout, EvictionTimeout
from installer.hostroot import HostRoot

log = logging.getLogger(__name__)

GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")
POLL_SECONDS = 2.0
REPORT_SECONDS = 30.0


def requests_gpu(pod: Json) -> bool:
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            if any(name.startswith(GPU_RESOURCES) for name in resources.get(kind) or {}):
                return True
    return False


def _name(pod: Json) -> tuple[str, str]:
    meta = pod["metadata"]
    return str(meta.get("namespace", "default")), str(meta["name"])


def not_evictable(pod: Json) -> str | None:
    """Why evicting this pod would not free the node (it comes straight back, or cannot be
    evicted at all), or None. Such pods are waited for instead."""
    meta = pod["metadata"]
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return "mirror pod of a static pod: the kubelet runs it"
    if any(ref.get("kind") == "DaemonSet" and ref.get("controller")
           for ref in meta.get("ownerReferences") or []):
        return "DaemonSet pod: it leaves when its DaemonSet stops selecting the node"
    for toleration in (pod.get("spec") or {}).get("tolerations") or []:
        key, effect = toleration.get("key"), toleration.get("effect")
        if (key in (None, "", "node.kubernetes.io/unschedulable")
                and effect in (None, "", "NoSchedule")
                and (key or toleration.get("operator") == "Exists")):
            return "tolerates node.kubernetes.io/unschedulable: it would come back at once"
    return None


def evict_gpu_pods(api: NodeClient, uid: str, config: Config) -> None:
    """Delete the GPU pods of the node (each by its uid, with its own grace period) once their
    PodDisruptionBudgets allow it, as an eviction would (installer/cluster/disruption.py)."""
    deadline = time.monotonic() + config.eviction_timeout
    budgets = disruption.Budgets(api)
    claims = dra.Claims(api)
    blocked: dict[tuple[str, str], str] = {}
    waited: dict[tuple[str, str], str] = {}
    forced = False
    while True:
        claims.new_pass()
        pods = [p for p in api.pods_on_node()
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                and (requests_gpu(p) or claims.nvidia_claim(p) is not None)]
        if not pods:
            log.info("no pod using a GPU (nvidia.com/gpu, or a claim of NVIDIA's DRA drivers) "
                     "is left on node %s", api.node)
            return
        budgets.new_pass()
        now_blocked: dict[tuple[str, str], str] = {}
        for pod in pods:
            ns, name = _name(pod)
            if pod["metadata"].get("deletionTimestamp"):
                continue  # evicted: terminating
            why = not_evictable(pod)
            if why is not None:
                if (ns, name) not in waited:
                    waited[(ns, name)] = why
                    log.info("not evicting GPU pod %s/%s (%s): waiting for it to leave", ns,
                             name, why)
                    api.event(uid, "GpuPodNotEvicted", f"pod {ns}/{name}: {why}; waiting "
                              "for it to leave", warning=True)
                continue
            verdict = budgets.verdict(pod)
            if verdict.blocked is not None:
                now_blocked[(ns, name)] = verdict.blocked
                if (ns, name) not in blocked:
                    log.info("eviction of %s/%s refused for now: %s (retrying)", ns, name,
                             verdict.blocked)
                    api.event(uid, "EvictionBlocked", f"pod {ns}/{name}: "
                              f"{verdict.blocked}; retrying", warning=True)
                continue
            if api.delete_pod(ns, name, str(pod["metadata"].get("uid", ""))) == "deleted":
                budgets.charge(verdict.budget)
                log.info("evicted GPU pod %s/%s", ns, name)
                api.event(uid, "GpuPodEvicted", f"evicted pod {ns}/{name} for the driver upgrade")
        blocked = now_blocked
        if time.monotonic() >= deadline:
            names = ", ".join(f"{ns}/{n}" + (f" ({waited[(ns, n)]})" if (ns, n) in waited
                                             else f" ({blocked[(ns, n)]})" if (ns, n) in blocked
                                             else " (terminating)")
                              for ns, n in map(_name, pods))
            deletable = [p for p in pods if _name(p) not in waited]
            if config.force_eviction and not forced and deletable:
                for pod in deletable:
                    log.warning("deleting GPU pod %s/%s (force eviction)", *_name(pod))
                    api.delete_pod(*_name(pod), str(pod["metadata"].get("uid", "")),
                                   grace_seconds=0)
                api.event(uid, "GpuPodsDeleted", f"force-deleted after "
                          f"{config.eviction_timeout:g} s: {names}", warning=True)
                forced = True
                deadline = time.monotonic() + 30
                continue
            raise EvictionTimeout(f"GPU pods still on node {api.node} after "
                                  f"{config.eviction_timeout:g} s: {names}")
        time.sleep(POLL_SECONDS)


def wait_for_holders(api: NodeClient, uid: str, root: HostRoot, config: Config) -> None:
    deadline = time.monotonic() + config.holders_timeout
    reported: tuple[str, ...] = ()
    last_report = 0.0
    while True:
        holders = host.holders_of(root, "/dev/nvidia")
        if not holders:
            return
        named = tuple(sorted({f"pid {h.pid} ({h.command}) holds {h.path}" for h in holders}))
        if time.monotonic() >= deadline:
            raise DriverHoldersTimeout(
                f"processes still hold the driver after {config.holders_timeout:g} s: "
                + "; ".join(named))
        if named != reported or time.monotonic() - last_report >= REPORT_SECONDS:
            log.info("waiting for processes to close /dev/nvidia*: %s", "; ".join(named))
            if named != reported:
                pids = sorted({h.pid for h in holders})
                api.event(uid, "WaitingForDriverHolders",
                          f"PIDs {', '.join(map(str, pids))} hold the driver: "
                          + "; ".join(named))
            reported, last_report = named, time.monotonic()
        time.sleep(POLL_SECONDS)
