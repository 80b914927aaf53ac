"""What verification found: the GPUs the driver reports, the report and its problems."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from installer.errors import VerificationFailed
from installer.runner import Result

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

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "memory_total_mib": self.memory_total_mib,
            "fabric": {"state": self.fabric_state, "status": self.fabric_status},
            "persistence_mode": self.persistence_mode,
        }

    @property
    def fabric_done(self) -> bool:
        return self.fabric_state == "completed" and self.fabric_status == "success"


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
    # Sections the components add to the JSON document (IMEX's channel device, ...).
    sections: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def fabric(self) -> str:
        """not-applicable (no NVSwitch), completed, pending, or unknown (no GPU reports it)."""
        if not self.fabric_required:
            return "not-applicable"
        reporting = [g for g in self.gpus if g.fabric_state not in (None, "unavailable")]
        if not reporting:
            return "unknown"
        return "completed" if all(g.fabric_done for g in reporting) else "pending"

    def to_json(self) -> dict[str, Any]:
        """The `installer verify --json` document."""
        return {
            "ok": self.ok,
            "expected_version": self.expected_version,
            "expected_gpus": list(self.expected_gpus),
            "driver_version": {
                "nvml": self.nvml_driver_version,
                "nvidia_smi": self.smi_driver_version,
            },
            "nvml_library": self.nvml_library,
            "gpus": [gpu.to_json() for gpu in self.gpus],
            "fabric": {"required": self.fabric_required, "state": self.fabric,
                       "nvswitches": list(self.switches)},
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
        if self.fabric_required:
            lines.append(f"fabric: {self.fabric} ({len(self.switches)} NVSwitch(es))")
        if self.ok:
            version = self.nvml_driver_version or self.smi_driver_version or "?"
            lines.append(
                f"OK: driver {version} answers through NVML and nvidia-smi "
                f"with {len(self.gpus)} GPU(s) as planned"
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
    """On an NVSwitch node: every GPU whose fabric state NVML reports must be registered."""
    problems = []
    for gpu in gpus:
        if gpu.fabric_state in (None, "unavailable") or gpu.fabric_done:
            continue
        label = f"GPU {gpu.index} ({gpu.pci_bus_id})"
        if gpu.fabric_state == "completed":
            problems.append(f"{label}: its NVLink fabric registration failed "
                            f"({gpu.fabric_status}); CUDA fails on it")
        else:
            problems.append(f"{label}: NVLink fabric {gpu.fabric_state}, not completed: "
                            "Fabric Manager has not configured the NVSwitches (CUDA fails with "
                            "error 802, system not yet initialized)")
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
