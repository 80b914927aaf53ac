"""Checks the loaded driver against the plan: nvidia-smi (smi.py), NVML in a child process
(nvml.py, child.py: the only pynvml user), a CUDA kernel in another (cuda.py, cuda_child.py: the
only libcuda user); report.py holds what they found."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from installer.runner import Runner
from installer.verify import cuda, nvml, smi
from installer.verify.child import main, nvml_query
from installer.verify.report import (
    GpuInfo,
    VerifyReport,
    fabric_problems,
    normalize_bus_id,
    require_ok,
)
from installer.verify.smi import parse_smi_csv, smi_argv

__all__ = ["GpuInfo", "VerifyReport", "fabric_problems", "main", "normalize_bus_id",
           "nvml_gpus", "nvml_query", "parse_smi_csv", "require_ok", "smi_argv", "verify"]

nvml_gpus = nvml.gpus  # the GPUs with fabric state and persistence mode (the daemons ask)


def verify(
    *,
    install_dir: Path,
    expected_version: str | None,
    expected_gpus: Sequence[str],
    runner: Runner,
    timeout: float = 60,
    fabric_required: bool = False,
    switches: Sequence[str] = (),
    fabric_starts_later: bool = False,
    arch: str = "",
    require_fabric: bool = False,
    diagnose: Optional[Callable[[Sequence[GpuInfo]], Sequence[str]]] = None,
    coherent_memory: tuple[Optional[str], Optional[str]] = (None, None),
) -> VerifyReport:
    """Asks the installed nvidia-smi and NVML (in a child process) about the loaded driver.

    Reads `<install_dir>/lib64` and runs two read-only commands through `runner`:
    `<install_dir>/bin/nvidia-smi --query-gpu=...` and `python -m installer.verify`, both with
    `LD_LIBRARY_PATH=<install_dir>/lib64`. `timeout` bounds the two together. Changes nothing
    on the host and raises nothing for a driver that answers wrongly: every difference from
    `expected_version` / `expected_gpus` is a sentence in `problems` (see `require_ok`).
    With `require_fabric` (`installer verify`; the run's verify-driver step only reports the
    fabric, since the daemons that complete it start after its readiness file), every GPU
    that reports an NVLink fabric must have completed it with success and not be unhealthy,
    whatever the board, else CUDA fails (`fabric_problems`); `diagnose` then says why it is
    not (the components' reasons, components.registry). `fabric_required` (an NVSwitch node)
    only says so in the report. `coherent_memory`: the CoherentGPUMemoryMode the loaded
    module reports (/proc/driver/nvidia/params) and the one the installer set (None: not set).
    Once NVML answered, a third child (`python -m installer.verify cuda`) runs a tiny kernel on
    every GPU through the installed libcuda.so.1; its error 802 (fabric not initialised) is
    expected, not a problem, where the fabric is completed later: with `fabric_starts_later`
    (install time on an NVSwitch node, before Fabric Manager) or, without `require_fabric`,
    while a GPU's fabric is still incomplete.
    """
    deadline = time.monotonic() + timeout
    lib_dir = Path(install_dir) / "lib64"
    env = {"LD_LIBRARY_PATH": str(lib_dir)}
    expected = tuple(expected_gpus)
    problems: list[str] = []

    smi_version, smi_gpus = smi.query(install_dir, env, runner, timeout, expected, problems)

    nvml_version: Optional[str] = None
    nvml_gpus: tuple[GpuInfo, ...] = ()
    nvml_library: Optional[str] = None
    library_problem = nvml.check_library(lib_dir)
    if library_problem is not None:
        problems.append(library_problem)
    else:
        remaining = max(deadline - time.monotonic(), 1.0)
        answer = nvml.query(env, runner, remaining, problems)
        if answer is not None:
            nvml_version, nvml_gpus, nvml_library = answer
            nvml.check_library_path(nvml_library, lib_dir, problems)

    nvml_answered = nvml_version is not None
    smi_answered = smi_version is not None
    for source, version, answered in (
        ("NVML", nvml_version, nvml_answered),
        ("nvidia-smi", smi_version, smi_answered),
    ):
        if answered and expected_version is not None and version != expected_version:
            problems.append(f"{source} reports driver {version}, expected {expected_version}")
    if expected_version is None and nvml_answered and smi_answered and nvml_version != smi_version:
        problems.append(f"NVML reports driver {nvml_version} but nvidia-smi reports {smi_version}")
    if nvml_answered:
        problems.extend(_compare_gpus("NVML", nvml_gpus, expected))
    if smi_answered:
        problems.extend(_compare_gpus("nvidia-smi", smi_gpus, expected))
    if nvml_answered and smi_answered:
        problems.extend(_compare_sources(nvml_gpus, smi_gpus))
    reasons: tuple[str, ...] = ()
    incomplete = fabric_problems(nvml_gpus) if nvml_answered else []
    if require_fabric and incomplete:
        if diagnose is not None:
            reasons = tuple(diagnose(nvml_gpus))
        problems.extend(incomplete)
        problems.extend(f"the fabric is not complete because {r}" for r in reasons)

    mode, wanted = coherent_memory
    if wanted is not None and mode != wanted:
        problems.append(f"the nvidia module reports CoherentGPUMemoryMode {mode!r} in "
                        f"/proc/driver/nvidia/params, expected {wanted!r} (a module loaded "
                        "without the installer's NVreg_CoherentGPUMemoryMode)")
    cuda_check = None
    if nvml_answered:
        remaining = max(deadline - time.monotonic(), 1.0)
        cuda_check = cuda.query(env, runner, remaining, nvml.PACKAGE_PARENT, problems)
        if cuda_check is not None:
            starts_later = fabric_starts_later or (not require_fabric and bool(incomplete))
            cuda_check, found = cuda.check_problems(cuda_check, nvml_gpus, lib_dir,
                                                    starts_later)
            problems.extend(found)

    return VerifyReport(
        expected_version=expected_version,
        expected_gpus=expected,
        nvml_driver_version=nvml_version,
        smi_driver_version=smi_version,
        gpus=nvml_gpus if nvml_answered else smi_gpus,
        problems=tuple(problems),
        nvml_library=nvml_library,
        smi_gpus=smi_gpus,
        fabric_required=fabric_required,
        switches=tuple(switches),
        cuda=cuda_check,
        arch=arch,
        fabric_reasons=reasons,
        coherent_memory=mode,
    )


def _compare_gpus(source: str, gpus: Sequence[GpuInfo], expected: Sequence[str]) -> list[str]:
    problems = []
    if len(gpus) != len(expected):
        problems.append(
            f"{source} sees {len(gpus)} GPU(s), expected {len(expected)}"
            f" ({', '.join(expected) or 'none'})"
        )
    for gpu in gpus:
        label = f"{source} GPU {gpu.index} ({gpu.pci_bus_id or 'no bus id'})"
        if not gpu.name:
            problems.append(f"{label} has no name")
        if not gpu.uuid:
            problems.append(f"{label} has no UUID")
        if gpu.memory_total_mib is None or gpu.memory_total_mib <= 0:
            problems.append(f"{label} reports memory {gpu.memory_total_mib}, expected > 0 MiB")
    seen = {gpu.pci_bus_id for gpu in gpus}
    wanted = {normalize_bus_id(a) for a in expected}
    for address in sorted(wanted - seen):
        problems.append(f"{source} does not see the expected GPU {address}")
    for address in sorted(seen - wanted):
        problems.append(f"{source} reports GPU {address}, which is not among the expected GPUs")
    return problems


def _compare_sources(nvml: Sequence[GpuInfo], smi: Sequence[GpuInfo]) -> list[str]:
    smi_by_bus = {gpu.pci_bus_id: gpu for gpu in smi}
    problems = []
    for gpu in nvml:
        other = smi_by_bus.get(gpu.pci_bus_id)
        if other is not None and gpu.uuid and other.uuid and gpu.uuid != other.uuid:
            problems.append(
                f"GPU {gpu.pci_bus_id} has UUID {gpu.uuid} in NVML but {other.uuid} in nvidia-smi"
            )
    return problems
