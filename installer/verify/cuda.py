"""CUDA's answer, asked in a child process (`python -m installer.verify cuda`, see cuda_child.py):
what each GPU did with a tiny kernel, what a CUDA error usually means, and the problems."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from installer.runner import Runner
from installer.verify.nvml import ask_child
from installer.verify.report import GpuInfo, normalize_bus_id

CUDA_SONAME = "libcuda.so.1"
NO_DEVICE = 100
SYSTEM_NOT_READY = 802

# CUresult codes of NVIDIA's cuda.h and what they usually mean on a node that has just been
# given a driver. 35 (cudaErrorInsufficientDriver) is the runtime API's: the driver API has no
# such code, and the real libcuda has no name for it.
MEANINGS = {
    3: "CUDA was not initialised: cuInit failed or was not called (a defect of the caller)",
    34: "the libcuda.so.1 found is the CUDA toolkit's stub, not the driver's library",
    46: "the GPU is busy or unavailable: exclusive-process compute mode with another process "
        "on it, or the GPU is being reset",
    100: "CUDA finds no usable GPU: the nvidia module sees none, device nodes (/dev/nvidia*) "
         "are missing or not accessible, or every GPU is in MIG mode without instances",
    101: "a GPU vanished between enumeration and use (fallen off the bus, or reset)",
    201: "no valid CUDA context: a driver defect, or the GPU was reset under the check",
    218: "the driver's PTX JIT compiler failed: libnvidia-ptxjitcompiler does not match the "
         "driver",
    221: "the PTX JIT compiler library (libnvidia-ptxjitcompiler.so.1) is not installed",
    222: "the driver is older than the PTX it was given (a defect of this check)",
    700: "the kernel faulted on a memory access: a broken GPU or driver (see Xid in dmesg)",
    719: "the kernel failed on the GPU (see Xid errors in dmesg)",
    802: "the system is not ready: on an NVSwitch/NVLink node the GPUs have not joined the "
         "NVLink fabric: Fabric Manager (and NVLSM on NVLink5 nodes) must run and register "
         "them first",
    803: "the user-space driver and the loaded kernel module are different versions: the old "
         "module is still loaded, or a stale libcuda answered",
    804: "CUDA forward compatibility was attempted on a GPU that does not support it: a "
         "cuda-compat libcuda shadows the driver's own",
    999: "an unknown error: often a missing /dev/nvidia-uvm (nvidia-uvm not loaded) or a GPU "
         "that has fallen off the bus (see dmesg)",
}


@dataclass(frozen=True)
class CudaError:
    call: str
    code: Optional[int]
    name: Optional[str]
    text: Optional[str]

    @property
    def meaning(self) -> Optional[str]:
        return MEANINGS.get(self.code) if self.code is not None else None

    def describe(self) -> str:
        named = f"{self.name or 'CUresult'} ({self.code})" if self.code is not None else ""
        parts = [f"{self.call} failed", named, self.text or "", self.meaning or ""]
        return ": ".join(p for p in parts if p)

    def to_json(self) -> dict[str, Any]:
        return {"ok": False, "call": self.call, "error": self.code, "name": self.name,
                "text": self.text, "meaning": self.meaning}


@dataclass(frozen=True)
class CudaCheck:
    """The CUDA child's answer: `error` when CUDA did not start, else one entry per device
    (PCI bus id in sysfs form -> its error, None when the kernel ran and its results compared)."""

    library: Optional[str]
    error: Optional[CudaError]
    devices: tuple[tuple[str, Optional[CudaError]], ...]
    # CUDA's failure is expected: 802 while Fabric Manager has not started yet, or 100 with
    # every GPU in MIG mode (no instances yet)
    tolerated: bool = False

    def for_gpu(self, pci_bus_id: str) -> dict[str, Any]:
        """The `cuda` block of one GPU in `verify --json`."""
        if self.error is not None:
            return self.error.to_json()
        for address, error in self.devices:
            if address == pci_bus_id:
                return error.to_json() if error else {"ok": True, "error": None, "name": None,
                                                      "meaning": None}
        return {"ok": False, "error": None, "name": None,
                "meaning": "CUDA does not enumerate this GPU"}

    @property
    def passed(self) -> bool:
        return self.error is None and all(error is None for _, error in self.devices)

    def to_json(self) -> dict[str, Any]:
        return {"library": self.library, "ok": self.passed,
                "failure_expected": self.tolerated,
                "error": self.error.to_json() if self.error else None}

    def summary(self) -> Optional[str]:
        """A line for `installer verify`'s output when CUDA's failure is not a problem."""
        if not self.tolerated or self.error is None:
            return None
        why = ("every GPU is in MIG mode: CUDA runs on its instances"
               if self.error.code == NO_DEVICE else "expected until Fabric Manager has run")
        return f"CUDA: {self.error.describe()} ({why})"


def argv() -> list[str]:
    return [sys.executable, "-m", "installer.verify", "cuda"]


def query(env: dict[str, str], runner: Runner, timeout: float, cwd: str,
          problems: list[str]) -> Optional[CudaCheck]:
    """Runs the CUDA child (read-only: it allocates GPU memory and frees it); None and a
    problem when it gave no answer."""
    asked = ask_child(argv(), runner, env=env, timeout=timeout, cwd=cwd, what="CUDA",
                      command="python -m installer.verify cuda", problems=problems)
    if asked is None:
        return None
    answer, _ = asked
    devices = []
    for raw in answer.get("devices") or []:
        devices.append((normalize_bus_id(str(raw.get("pci_bus_id") or "")),
                        _error(raw.get("error"))))
    library = answer.get("library")
    return CudaCheck(library if isinstance(library, str) else None, _error(answer.get("error")),
                     tuple(devices))


def _error(raw: object) -> Optional[CudaError]:
    if not isinstance(raw, dict):
        return None
    code = raw.get("code")
    return CudaError(str(raw.get("call") or "?"), code if isinstance(code, int) else None,
                     _str(raw.get("name")), _str(raw.get("text")))


def _str(value: object) -> Optional[str]:
    return value if isinstance(value, str) else None


def check_problems(check: CudaCheck, gpus: Sequence[GpuInfo], lib_dir: Path,
                   fabric_starts_later: bool) -> tuple[CudaCheck, list[str]]:
    """What is wrong with CUDA on these NVML GPUs. With `fabric_starts_later` (an NVSwitch node
    whose Fabric Manager starts after this check) cuInit's 802 is expected: not a problem; nor
    is a GPU in MIG mode that CUDA does not enumerate."""
    if check.library is not None and Path(check.library).resolve().parent != lib_dir.resolve():
        return check, [f"CUDA answered from {check.library}, not from the installed {lib_dir}"]
    # A GPU in MIG mode is visible to CUDA only through its instances, which the MIG manager
    # creates after the driver: without them CUDA does not enumerate it (none at all: 100).
    mig = {gpu.pci_bus_id for gpu in gpus if gpu.mig_mode == "enabled"}
    if check.error is not None:
        expected = ((check.error.code == SYSTEM_NOT_READY and fabric_starts_later)
                    or (check.error.code == NO_DEVICE and bool(gpus) and len(mig) == len(gpus)))
        if expected:
            return CudaCheck(check.library, check.error, check.devices, tolerated=True), []
        return check, [f"CUDA {check.error.describe()}"]
    problems = []
    seen = {address for address, _ in check.devices}
    for gpu in gpus:
        label = f"GPU {gpu.index} ({gpu.pci_bus_id})"
        if gpu.pci_bus_id not in seen and gpu.pci_bus_id not in mig:
            problems.append(f"{label}: CUDA does not enumerate it, though NVML does")
    for address, error in check.devices:
        if error is not None:
            problems.append(f"CUDA on GPU {address}: {error.describe()}")
    return check, problems
