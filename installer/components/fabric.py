"""The node's NVLink fabric as readiness sees it, whatever the board: every GPU that reports a
fabric completes it before the node is ready; why it has not (each component's diagnosis); the
bounded wait of the fabricmanager container where no daemon of ours manages the fabric."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Optional

from installer import host
from installer.errors import FabricNotReady
from installer.hostroot import HostRoot

if TYPE_CHECKING:  # verify/ is loaded by the container's loop only
    from installer.verify import GpuInfo

log = logging.getLogger(__name__)

# A diagnosis: why the fabric of these GPUs is not complete, a phrase each ("Fabric Manager
# (nv-fabricmanager) is not running"); nothing when it has nothing to say. Registered in
# components/registry.py fabric_diagnoses().
Diagnosis = Callable[[HostRoot, "Sequence[GpuInfo]"], "list[str]"]

# nvml.h: the health mask's partition-assigned field, 2 bits at shift 12 (1 true, 2 false).
PARTITION_SHIFT = 12
PARTITION_FALSE = 2
# NVML keeps an NVLink fabric state for Hopper and newer only: before them no GPU can report
# one, so there is nothing to wait for and NVML is not asked.
FABRIC_ARCHITECTURES = frozenset({"hopper", "blackwell"})


def may_report_fabric(root: HostRoot) -> bool:
    """Whether any GPU in sysfs is of an architecture NVML keeps a fabric state for (an
    unknown id newer than the shipped list counts: it is newer than Blackwell's first)."""
    from installer.release import gpus

    database = gpus.shipped_database()
    for gpu in host.nvidia_gpus(root):
        model = database.describe(gpu).model
        if model.architecture in FABRIC_ARCHITECTURES or (
                not model.known and gpu.device_id >= 0x2300):
            return True
    return False


def process_running(root: HostRoot, name: str) -> bool:
    """A process whose program (its executable or argv[0]) is called `name`, in the host's
    /proc (comm is cut at 15 characters: nv-fabricmanager would not match it)."""
    proc = root.local_resolved("/proc")
    try:
        pids = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            argv0 = (proc / pid / "cmdline").read_bytes().split(b"\0", 1)[0].decode(
                errors="replace")
        except OSError:
            continue
        if os.path.basename(argv0) == name:
            return True
        try:
            if os.path.basename(os.readlink(proc / pid / "exe")) == name:
                return True
        except OSError:
            continue
    return False


def partition_reasons(root: HostRoot, gpus: Sequence[GpuInfo]) -> list[str]:
    """Shared NVSwitch mode (FABRIC_MODE=1): GPUs stay in progress until a fabric partition
    that holds them is activated; the health mask says no partition is assigned."""
    waiting = [g for g in gpus if g.fabric_health_mask is not None and
               (g.fabric_health_mask >> PARTITION_SHIFT) & 0x3 == PARTITION_FALSE]
    if not waiting:
        return []
    listed = ", ".join(f"GPU {g.index} ({g.pci_bus_id})" for g in waiting)
    return [f"no fabric partition is activated for {listed} (shared NVSwitch mode, "
            "FABRIC_MODE=1: activate a partition through Fabric Manager's API)"]


class FabricWatch:
    """The fabricmanager container where no daemon of ours manages the fabric (an NVL72
    compute tray, NVIDIA_FABRICMANAGER=false, a board without switches): nothing runs, the
    readiness file waits for the fabric all the same."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def poll(self) -> int | None:
        return None

    def stop(self, timeout: float) -> None:
        return None


class FabricWait:
    """Asks NVML (every `every` seconds) until each GPU that reports a fabric completed it.
    Past `timeout` seconds: where nothing of ours runs it raises FabricNotReady naming the
    diagnoses; beside our Fabric Manager it logs that error once and keeps waiting (stopping
    Fabric Manager would undo the fabric, and a shared-mode node waits for its partition)."""

    def __init__(self, install_dir: os.PathLike[str], root: HostRoot,
                 diagnose: Callable[[Sequence[GpuInfo]], list[str]], timeout: float,
                 every: float = 3.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.install_dir = install_dir
        self.root = root
        self.diagnose = diagnose
        self.timeout = timeout
        self.every = every
        self.clock = clock
        self.since: Optional[float] = None
        self.asked = float("-inf")
        self.warned = False
        self.last: Sequence[GpuInfo] = ()  # the GPUs NVML last reported

    def restart(self) -> None:
        self.since, self.asked, self.warned, self.last = None, float("-inf"), False, ()

    def check(self, runner: object, *, ours_running: bool) -> Optional[str]:
        """None while waiting (or between asks); else the states NVML reported, sorted and
        joined ("completed", or "not-supported" where no GPU reports a fabric)."""
        from installer import verify  # the container's loop only (the warm path never asks)

        now = self.clock()
        if self.since is None:
            self.since = now
        if now - self.asked < self.every:
            return None
        self.asked = now
        gpus, problems = verify.nvml_gpus(self.install_dir, runner)  # type: ignore[arg-type]
        self.last = gpus
        # An NVML that does not answer cannot vouch for the fabric: that is what is missing.
        missing = problems or verify.fabric_problems(gpus)
        if not missing:
            return ",".join(sorted({g.fabric_state or "unknown" for g in gpus}))
        if now - self.since >= self.timeout > 0:
            error = not_ready(missing, self.diagnose(gpus), self.timeout)
            if not ours_running:
                raise error
            if not self.warned:
                log.error("error[%s]: %s", error.reference, error.message)
                self.warned = True
        return None


def registering(gpus: Sequence[GpuInfo]) -> bool:
    """Whether a fabric manager has taken these GPUs in hand: one reports its fabric in
    progress or completed (not only not-started)."""
    return any(g.fabric_state in ("in-progress", "completed") for g in gpus)


def not_ready(missing: Sequence[str], reasons: Sequence[str], waited: float) -> FabricNotReady:
    why = ("; because " + "; ".join(reasons)) if reasons else (
        "; no component named a reason (the fabric is managed off this node, or by the host)")
    return FabricNotReady(f"the NVLink fabric is not complete after {waited:g} s: "
                          + "; ".join(missing) + why)
