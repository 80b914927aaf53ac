"""What verification found: the GPUs the driver reports, the report and its problems."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from installer.errors import VerificationFailed
from installer.runner import Result


class CudaAnswer(Protocol):
    """What the CUDA check found (cuda.CudaCheck): the `cuda` blocks of `verify --json`."""

    @property
    def passed(self) -> bool: ...  # the kernel ran and compared on every GPU CUDA enumerates

    def for_gpu(self, pci_bus_id: str) -> dict[str, Any]: ...

    def to_json(self) -> dict[str, Any]: ...

    def summary(self) -> Optional[str]: ...


BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the driver reports it; `pci_bus_id` is in sysfs form (0000:3b:00.0)."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: Optional[int]
    # NVML's fabric registration (child.FABRIC_STATES names, or "unavailable": NVML does not
    # report it for this GPU) with its status ("success" or the NVML error), and whether
    # persistence mode is "enabled" or "disabled" (None: not asked, or NVML failed). NVML's
    # answers only: the same GPU from nvidia-smi compares equal without them.
    fabric_state: Optional[str] = field(default=None, compare=False)
    fabric_status: Optional[str] = field(default=None, compare=False)
    persistence_mode: Optional[str] = field(default=None, compare=False)
    mig_mode: Optional[str] = field(default=None, compare=False)  # "enabled": CUDA sees instances
    # The v3 struct's rest (None where the driver's NVML has only the older calls): the
    # cluster UUID (None: all zero), clique ID, health mask and summary (child.HEALTH_SUMMARIES).
    fabric_cluster_uuid: Optional[str] = field(default=None, compare=False)
    fabric_clique_id: Optional[int] = field(default=None, compare=False)
    fabric_health_mask: Optional[int] = field(default=None, compare=False)
    fabric_health_summary: Optional[str] = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "memory_total_mib": self.memory_total_mib,
            "fabric": {"state": self.fabric_state, "status": self.fabric_status,
                       "cluster_uuid": self.fabric_cluster_uuid,
                       "clique_id": self.fabric_clique_id,
                       "health_mask": self.fabric_health_mask,
                       "health_summary": self.fabric_health_summary},
            "persistence_mode": self.persistence_mode,
        }

    @property
    def fabric_reported(self) -> bool:
        """NVML keeps a fabric for this GPU: it must complete before CUDA runs on it."""
        return self.fabric_state not in (None, "unavailable", "not-supported")

    @property
    def fabric_done(self) -> bool:
        return (self.fabric_state == "completed" and self.fabric_status == "success"
                and self.fabric_health_summary != "unhealthy")

    @property
    def fabric_attached(self) -> bool:
        """go-nvlib's IsFabricAttached, which GFD and the DRA driver build the clique from:
        completed, success, a cluster UUID that is not all zero."""
        return (self.fabric_state == "completed" and self.fabric_status == "success"
                and self.fabric_cluster_uuid is not None)


@dataclass(frozen=True)
class VerifyReport:
    """What the driver answered and every way it differs from the plan.

    `gpus` comes from NVML when NVML answered, otherwise from nvidia-smi.
    """

    expected_version: Optional[str]
    expected_gpus: tuple[str, ...]
    nvml_driver_version: Optional[str]
    smi_driver_version: Optional[str]
    gpus: tuple[GpuInfo, ...]
    problems: tuple[str, ...]
    nvml_library: Optional[str] = None
    smi_gpus: tuple[GpuInfo, ...] = field(default=(), repr=False)
    fabric_required: bool = False  # an NVSwitch node (Fabric Manager must have run)
    switches: tuple[str, ...] = ()
    cuda: Optional[CudaAnswer] = None  # None: not asked (NVML did not answer) or no answer
    arch: str = ""  # the host's machine (x86_64, aarch64): which .run and user space it takes
    # Why the fabric is not complete, as the components diagnose it (components.registry).
    fabric_reasons: tuple[str, ...] = ()
    # CoherentGPUMemoryMode as the loaded module reports it (None: it reports none).
    coherent_memory: Optional[str] = None
    # Sections the components add to the JSON document (IMEX's channel device, ...).
    sections: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def fabric(self) -> str:
        """completed or pending (some GPU reports a fabric), unknown (an NVSwitch node whose
        GPUs report none), else not-applicable."""
        reporting = [g for g in self.gpus if g.fabric_reported]
        if not reporting:
            return "unknown" if self.fabric_required else "not-applicable"
        return "completed" if all(g.fabric_done for g in reporting) else "pending"

    @property
    def clique(self) -> Optional[str]:
        """`<clusterUUID>.<cliqueId>` as GFD labels it (nvidia.com/gpu.clique): only when every
        fabric-attached GPU names the same pair, and at least one is attached."""
        pairs = {(g.fabric_cluster_uuid, g.fabric_clique_id) for g in self.gpus
                 if g.fabric_attached}
        if len(pairs) != 1:
            return None
        cluster, clique = pairs.pop()
        return f"{cluster}.{clique}"

    def to_json(self) -> dict[str, Any]:
        """The `installer verify --json` document."""
        return {
            "ok": self.ok,
            "architecture": self.arch or None,
            "expected_version": self.expected_version,
            "expected_gpus": list(self.expected_gpus),
            "driver_version": {
                "nvml": self.nvml_driver_version,
                "nvidia_smi": self.smi_driver_version,
            },
            "nvml_library": self.nvml_library,
            "gpus": [{**gpu.to_json(), "cuda": self.cuda.for_gpu(gpu.pci_bus_id)
                      if self.cuda else None} for gpu in self.gpus],
            "cuda": self.cuda.to_json() if self.cuda else None,
            "fabric": {"required": self.fabric_required, "state": self.fabric,
                       "nvswitches": list(self.switches), "clique": self.clique,
                       "reasons": list(self.fabric_reasons)},
            "coherent_memory": self.coherent_memory,
            **self.sections,
            "problems": list(self.problems),
        }

    def summary_lines(self) -> list[str]:
        """One line per GPU, then `OK: ...` or one `problem: ...` line per problem."""
        lines = []
        for gpu in self.gpus:
            memory = "? MiB" if gpu.memory_total_mib is None else f"{gpu.memory_total_mib} MiB"
            extra = "".join(
                f", {label} {value}" for label, value in
                (("fabric", gpu.fabric_state), ("persistence mode", gpu.persistence_mode))
                if value is not None)
            lines.append(
                f"GPU {gpu.index}: {gpu.name or '?'} {gpu.pci_bus_id} {gpu.uuid or '?'} {memory}"
                + extra
            )
        if self.fabric != "not-applicable":
            lines.append(f"fabric: {self.fabric} ({len(self.switches)} NVSwitch(es)"
                         + (f", clique {self.clique})" if self.clique else ")"))
        cuda_line = self.cuda.summary() if self.cuda is not None else None
        if cuda_line:
            lines.append(cuda_line)
        if self.ok:
            version = self.nvml_driver_version or self.smi_driver_version or "?"
            lines.append(
                f"OK: driver {version} answers through NVML and nvidia-smi "
                f"with {len(self.gpus)} GPU(s) as planned"
                + (", and runs a CUDA kernel on each" if self.cuda and self.cuda.passed else "")
            )
        else:
            lines.extend(f"problem: {p}" for p in self.problems)
        return lines


def require_ok(report: VerifyReport) -> None:
    """Raises VerificationFailed listing every problem of `report`; returns if there are none."""
    if report.ok:
        return
    listed = "\n".join(f"  - {p}" for p in report.problems)
    raise VerificationFailed(
        f"the driver does not answer as planned ({len(report.problems)} problem(s)):\n{listed}"
    )


def fabric_problems(gpus: Sequence[GpuInfo]) -> list[str]:
    """Whatever the board: every GPU that reports an NVLink fabric (state other than
    NOT_SUPPORTED) must have completed it with success and a summary other than UNHEALTHY,
    else CUDA fails on it (error 802, system not yet initialized)."""
    problems = []
    for gpu in gpus:
        if not gpu.fabric_reported or gpu.fabric_done:
            continue
        label = f"GPU {gpu.index} ({gpu.pci_bus_id})"
        if gpu.fabric_state == "error":
            problems.append(f"{label}: NVML could not read its NVLink fabric ({gpu.fabric_status});"
                            " a fabric that cannot be read is not known to be up")
        elif gpu.fabric_state != "completed":
            problems.append(f"{label}: NVLink fabric {gpu.fabric_state}, not completed (CUDA "
                            "fails with error 802, system not yet initialized)")
        elif gpu.fabric_status != "success":
            problems.append(f"{label}: its NVLink fabric registration failed "
                            f"({gpu.fabric_status}); CUDA fails on it")
        else:
            problems.append(f"{label}: its NVLink fabric completed but its health summary is "
                            f"unhealthy (health mask {gpu.fabric_health_mask:#x})"
                            if gpu.fabric_health_mask is not None else
                            f"{label}: its NVLink fabric completed but is unhealthy")
    return problems


def normalize_bus_id(bus_id: str) -> str:
    """`00000000:3B:00.0` (nvidia-smi, NVML) and `0000:3b:00.0` (sysfs) -> `0000:3b:00.0`.

    Text that is not a PCI address comes back stripped and lower-cased, so it still compares.
    """
    text = bus_id.strip()
    match = BUS_ID.match(text)
    if match is None:
        return text.lower()
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def int_or_none(value: object) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:  # nvidia-smi prints [N/A] or [Insufficient Permissions]
            return None
    return None


def last_line(result: Result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"
