"""GPU clients through Dynamic Resource Allocation: a pod that holds a ResourceClaim allocated by
NVIDIA's DRA drivers uses the driver as surely as one that requests nvidia.com/gpu, though it
requests no extended resource. And NVIDIA's DRA kubelet plugin must outlive those pods: the
kubelet calls it (NodeUnprepareResources) before a claim-holding pod may finish terminating, so
its deploy label is paused only once they are gone."""

from __future__ import annotations

from installer.cluster.client import Json, NodeClient

# status.allocation.devices.results[].driver of the claims NVIDIA's DRA drivers allocate: GPUs
# (and MIG devices) and ComputeDomains (IMEX channels on NVLink fabrics).
NVIDIA_DRIVERS = ("gpu.nvidia.com", "compute-domain.nvidia.com")
# The DRA driver's ComputeDomain daemons (IMEX) hold compute-domain.nvidia.com claims too, but
# run as a DaemonSet per ComputeDomain: drain.not_evictable waits for them, never deletes them
# (a deleted one is recreated at once).
# Components (nvidia.com/gpu.deploy.<c>) paused after the GPU pods left, not before: NVIDIA's
# DRA kubelet plugin (the label the GPU Operator gives the node for it).
AFTER_PODS = ("dra-driver",)


def claim_names(pod: Json) -> list[str]:
    """The ResourceClaims a pod uses: named in spec.resourceClaims, or (made from a template)
    in status.resourceClaimStatuses, where the resourceclaim controller records their names."""
    names: list[str] = []
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    for entry in (spec.get("resourceClaims") or []) + (status.get("resourceClaimStatuses")
                                                        or []):
        name = entry.get("resourceClaimName") if isinstance(entry, dict) else None
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    return names


def allocated_by_nvidia(claim: Json) -> str | None:
    """The NVIDIA DRA driver that allocated a device of the claim, or None."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or []:
        if isinstance(result, dict) and result.get("driver") in NVIDIA_DRIVERS:
            return str(result["driver"])
    return None


class Claims:
    """The claims one drain pass meets, each read once per pass (GET by name: the pod names
    them, and a list would read every claim of the namespace)."""

    def __init__(self, api: NodeClient) -> None:
        self._api = api
        self._read: dict[tuple[str, str], Json | None] = {}

    def new_pass(self) -> None:
        self._read.clear()

    def nvidia_claim(self, pod: Json) -> str | None:
        """`<namespace>/<claim> (<driver>)` for the first claim of the pod allocated by an
        NVIDIA DRA driver, or None. Raises ClusterApi* errors."""
        namespace = str((pod.get("metadata") or {}).get("namespace", "default"))
        for name in claim_names(pod):
            key = (namespace, name)
            if key not in self._read:
                self._read[key] = self._api.resource_claim(namespace, name)
            claim = self._read[key]
            driver = allocated_by_nvidia(claim) if claim is not None else None
            if driver is not None:
                return f"{namespace}/{name} ({driver})"
        return None
