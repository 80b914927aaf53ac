"""Checks the loaded driver against the plan: nvidia-smi and NVML (the only pynvml user)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from installer.errors import CommandFailed, CommandNotFound, VerificationFailed
from installer.runner import Result, Runner

SMI_QUERY = "driver_version,name,uuid,pci.bus_id,memory.total"
SMI_EXIT_NO_DRIVER = 9
SMI_EXIT_NOT_FOUND = 6
SMI_EXIT_NO_LIBRARY = 12
NVML_SONAME = "libnvidia-ml.so.1"
# The directory that holds the `installer` package: the child runs from there so that
# `-m installer.verify` imports this copy whether or not the package is pip-installed,
# and a stray `pynvml.py` or `installer/` in the caller's cwd cannot shadow it.
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)

_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the driver reports it; `pci_bus_id` is in sysfs form (0000:3b:00.0)."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: Optional[int]
    # issue 21: NVML's fabric registration (FABRIC_STATES names, or "unavailable": NVML does
    # not report it for this GPU) with its status ("success" or the NVML error), and whether
    # persistence mode is "enabled" or "disabled" (None: not asked, or NVML failed).
    fabric_state: Optional[str] = None
    fabric_status: Optional[str] = None
    persistence_mode: Optional[str] = None

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
    fabric_required: bool = False  # issue 21: an NVSwitch node (Fabric Manager must have run)
    switches: tuple[str, ...] = ()

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


def verify(
    *,
    install_dir: Path,
    expected_version: str | None,
    expected_gpus: Sequence[str],
    runner: Runner,
    timeout: float = 60,
    fabric_required: bool = False,
    switches: Sequence[str] = (),
) -> VerifyReport:
    """Asks the installed nvidia-smi and NVML (in a child process) about the loaded driver.

    Reads `<install_dir>/lib64` and runs two read-only commands through `runner`:
    `<install_dir>/bin/nvidia-smi --query-gpu=...` and `python -m installer.verify`, both with
    `LD_LIBRARY_PATH=<install_dir>/lib64`. `timeout` bounds the two together. Changes nothing
    on the host and raises nothing for a driver that answers wrongly: every difference from
    `expected_version` / `expected_gpus` is a sentence in `problems` (see `require_ok`).
    With `fabric_required` (an NVSwitch node) every GPU that reports its fabric state must
    have completed its registration with success (Fabric Manager ran), else CUDA fails.
    """
    deadline = time.monotonic() + timeout
    lib_dir = Path(install_dir) / "lib64"
    env = {"LD_LIBRARY_PATH": str(lib_dir)}
    expected = tuple(expected_gpus)
    problems: list[str] = []

    smi_version, smi_gpus = _query_smi(install_dir, env, runner, timeout, expected, problems)

    nvml_version: Optional[str] = None
    nvml_gpus: tuple[GpuInfo, ...] = ()
    nvml_library: Optional[str] = None
    library_problem = _check_nvml_library(lib_dir)
    if library_problem is not None:
        problems.append(library_problem)
    else:
        remaining = max(deadline - time.monotonic(), 1.0)
        answer = _query_nvml(env, runner, remaining, problems)
        if answer is not None:
            nvml_version, nvml_gpus, nvml_library = answer
            _check_nvml_library_path(nvml_library, lib_dir, problems)

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
    if nvml_answered and fabric_required:
        problems.extend(fabric_problems(nvml_gpus))

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


def nvml_gpus(install_dir: Path, runner: Runner, timeout: float = 60
              ) -> tuple[tuple[GpuInfo, ...], list[str]]:
    """The GPUs as NVML reports them (with fabric state and persistence mode), asked in a
    child with the install dir's libraries, and what went wrong asking. Read-only."""
    lib_dir = Path(install_dir) / "lib64"
    problems: list[str] = []
    answer = _query_nvml({"LD_LIBRARY_PATH": str(lib_dir)}, runner, timeout, problems)
    return (answer[1] if answer else ()), problems


def normalize_bus_id(bus_id: str) -> str:
    """`00000000:3B:00.0` (nvidia-smi, NVML) and `0000:3b:00.0` (sysfs) -> `0000:3b:00.0`.

    Text that is not a PCI address comes back stripped and lower-cased, so it still compares.
    """
    text = bus_id.strip()
    match = _BUS_ID.match(text)
    if match is None:
        return text.lower()
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


# --- nvidia-smi -------------------------------------------------------------------------


def smi_argv(install_dir: Path) -> list[str]:
    return [
        str(Path(install_dir) / "bin" / "nvidia-smi"),
        f"--query-gpu={SMI_QUERY}",
        "--format=csv,noheader,nounits",
    ]


def _query_smi(
    install_dir: Path,
    env: dict[str, str],
    runner: Runner,
    timeout: float,
    expected: Sequence[str],
    problems: list[str],
) -> tuple[Optional[str], tuple[GpuInfo, ...]]:
    argv = smi_argv(install_dir)
    try:
        result = runner.run(argv, check=False, timeout=timeout, env=env)
    except CommandNotFound:
        problems.append(f"nvidia-smi is missing: {argv[0]} does not exist")
        return None, ()
    except CommandFailed as exc:  # only a timeout, with check=False
        problems.append(f"nvidia-smi did not answer: {exc.message.splitlines()[0]}")
        return None, ()
    if result.returncode == SMI_EXIT_NO_DRIVER:
        problems.append(
            f"nvidia-smi could not communicate with the driver (exit {SMI_EXIT_NO_DRIVER})"
        )
        return None, ()
    if result.returncode == SMI_EXIT_NO_LIBRARY:
        problems.append(f"nvidia-smi could not load {NVML_SONAME} (exit {SMI_EXIT_NO_LIBRARY})")
        return None, ()
    if result.returncode == SMI_EXIT_NOT_FOUND and "No devices were found" in result.output:
        if expected:
            problems.append(
                f"nvidia-smi found no GPUs (exit {SMI_EXIT_NOT_FOUND}), expected {len(expected)}"
                f" ({', '.join(expected)})"
            )
        return None, ()
    if result.returncode != 0:
        problems.append(f"nvidia-smi failed with exit {result.returncode}: {_last_line(result)}")
        return None, ()
    version, gpus = parse_smi_csv(result.output)
    if version is None:
        problems.append(f"nvidia-smi printed no GPU rows: {_last_line(result)}")
    return version, gpus


def parse_smi_csv(output: str) -> tuple[Optional[str], tuple[GpuInfo, ...]]:
    """Parses `--query-gpu=driver_version,name,uuid,pci.bus_id,memory.total` csv lines.

    Fields are `, `-separated; a GPU name may hold spaces (and, defensively, commas), so the
    name is everything between the first field and the last three. Lines that are not GPU
    rows (warnings nvidia-smi prints on stderr, merged by the runner) are skipped.
    """
    version: Optional[str] = None
    gpus: list[GpuInfo] = []
    for line in output.splitlines():
        fields = [f.strip() for f in line.split(", ")]
        if len(fields) < 5 or _BUS_ID.match(fields[-2]) is None:
            continue
        if version is None:
            version = fields[0]
        gpus.append(
            GpuInfo(
                index=len(gpus),
                name=", ".join(fields[1:-3]),
                uuid=fields[-3],
                pci_bus_id=normalize_bus_id(fields[-2]),
                memory_total_mib=_int_or_none(fields[-1]),
            )
        )
    return version, tuple(gpus)


# --- NVML (child process) ---------------------------------------------------------------


def nvml_argv() -> list[str]:
    return [sys.executable, "-m", "installer.verify"]


def _check_nvml_library(lib_dir: Path) -> Optional[str]:
    if (lib_dir / NVML_SONAME).exists():
        return None
    versioned = sorted(p.name for p in lib_dir.glob("libnvidia-ml.so.*.*"))
    if versioned:
        return (
            f"{lib_dir / NVML_SONAME} is missing but {', '.join(versioned)} is there: the "
            f"soname link comes from ldconfig (`ldconfig -n {lib_dir}` or the ld cache step); "
            f"NVML was not asked"
        )
    return f"NVML is not installed: no {NVML_SONAME} (nor libnvidia-ml.so.<version>) in {lib_dir}"


def _query_nvml(
    env: dict[str, str],
    runner: Runner,
    timeout: float,
    problems: list[str],
) -> Optional[tuple[Optional[str], tuple[GpuInfo, ...], Optional[str]]]:
    try:
        result = runner.run(nvml_argv(), check=False, timeout=timeout, env=env, cwd=_PACKAGE_PARENT)
    except (CommandNotFound, CommandFailed) as exc:
        problems.append(f"the NVML check did not run: {exc.message.splitlines()[0]}")
        return None
    answer = _last_json_object(result.output)
    if answer is None:
        problems.append(
            f"the NVML check (python -m installer.verify) exited {result.returncode} "
            f"without an answer: {_last_line(result)}"
        )
        return None
    library = answer.get("library")
    library = library if isinstance(library, str) else None
    error = answer.get("error")
    if isinstance(error, dict):
        problems.append(
            f"NVML {error.get('call', '?')} failed: {error.get('type', '?')}: "
            f"{error.get('message', '')}"
        )
        return None
    version = answer.get("driver_version")
    if version is None:
        problems.append(f"the NVML check answered without a driver version: {_last_line(result)}")
        return None
    gpus: list[GpuInfo] = []
    for raw in answer.get("gpus") or []:
        gpu_error = raw.get("error")
        if isinstance(gpu_error, dict):
            problems.append(
                f"NVML {gpu_error.get('call', '?')} failed for GPU {raw.get('index')}: "
                f"{gpu_error.get('type', '?')}: {gpu_error.get('message', '')}"
            )
        gpus.append(
            GpuInfo(
                index=int(raw.get("index", len(gpus))),
                name=str(raw.get("name") or ""),
                uuid=str(raw.get("uuid") or ""),
                pci_bus_id=normalize_bus_id(str(raw.get("pci_bus_id") or "")),
                memory_total_mib=_int_or_none(raw.get("memory_total_mib")),
                fabric_state=_str_or_none((raw.get("fabric") or {}).get("state")),
                fabric_status=_str_or_none((raw.get("fabric") or {}).get("status")),
                persistence_mode=_str_or_none(raw.get("persistence_mode")),
            )
        )
    return str(version), tuple(gpus), library


def _str_or_none(value: object) -> Optional[str]:
    return value if isinstance(value, str) else None


def _check_nvml_library_path(library: Optional[str], lib_dir: Path, problems: list[str]) -> None:
    # The dynamic loader falls back to the ld cache, so a stale host library could answer.
    if library is None:
        return
    if Path(library).resolve().parent != lib_dir.resolve():
        problems.append(f"NVML answered from {library}, not from the installed {lib_dir}")


def _last_json_object(output: str) -> Optional[dict[str, Any]]:
    for line in reversed(output.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


# --- comparison -------------------------------------------------------------------------


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


def _int_or_none(value: object) -> Optional[int]:
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


def _last_line(result: Result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


# --- the child: python -m installer.verify ----------------------------------------------


def nvml_query() -> dict[str, Any]:
    """Asks NVML (libnvidia-ml.so.1 as the dynamic loader finds it) about the driver.

    Runs in the child process only, so a crashing or hanging library cannot take the
    installer down. NVML errors become `{"error": {"call", "type", "message"}}`.
    """
    answer: dict[str, Any] = {"driver_version": None, "gpus": [], "library": None, "error": None}
    call = "import pynvml"
    try:
        import pynvml

        call = "nvmlInit"
        pynvml.nvmlInit()
        answer["library"] = _loaded_library_path()
        try:
            call = "nvmlSystemGetDriverVersion"
            answer["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
            call = "nvmlDeviceGetCount"
            count = int(pynvml.nvmlDeviceGetCount())
            answer["gpus"] = [_nvml_device(pynvml, index) for index in range(count)]
        finally:
            call = "nvmlShutdown"
            pynvml.nvmlShutdown()
    except Exception as exc:  # every NVMLError_* and a missing pynvml, reported by name
        answer["error"] = _error_json(call, exc)
    return answer


def _nvml_device(pynvml: Any, index: int) -> dict[str, Any]:
    gpu: dict[str, Any] = {
        "index": index,
        "name": None,
        "uuid": None,
        "pci_bus_id": None,
        "memory_total_mib": None,
        "error": None,
    }
    call = "nvmlDeviceGetHandleByIndex"
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        call = "nvmlDeviceGetName"
        gpu["name"] = _text(pynvml.nvmlDeviceGetName(handle))
        call = "nvmlDeviceGetUUID"
        gpu["uuid"] = _text(pynvml.nvmlDeviceGetUUID(handle))
        call = "nvmlDeviceGetPciInfo"
        gpu["pci_bus_id"] = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
        call = "nvmlDeviceGetMemoryInfo"
        gpu["memory_total_mib"] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20)
    except Exception as exc:
        gpu["error"] = _error_json(call, exc)
        return gpu
    gpu["fabric"] = _nvml_fabric(pynvml, handle)
    try:
        mode = pynvml.nvmlDeviceGetPersistenceMode(handle)
        gpu["persistence_mode"] = "enabled" if mode == pynvml.NVML_FEATURE_ENABLED else "disabled"
    except Exception:  # not supported on this GPU or platform: left unknown
        gpu["persistence_mode"] = None
    return gpu


# nvml.h's NVML_GPU_FABRIC_STATE_* values.
FABRIC_STATES = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}


def _nvml_fabric(pynvml: Any, handle: Any) -> dict[str, Any]:
    """nvmlDeviceGetGpuFabricInfoV (v2 struct), else the v1 call of older drivers. A GPU that
    NVML keeps no fabric state for (before Hopper) answers NOT_SUPPORTED: "unavailable"."""
    import ctypes

    versioned = getattr(pynvml, "c_nvmlGpuFabricInfoV_t", None)
    try:
        try:
            if versioned is None:
                raise pynvml.NVMLError_FunctionNotFound(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            info = versioned()
            pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except pynvml.NVMLError_FunctionNotFound:
            info = pynvml.c_nvmlGpuFabricInfo_t()
            pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except pynvml.NVMLError_NotSupported:
        return {"state": "unavailable", "status": None}
    except Exception as exc:
        return {"state": "unavailable", "status": None, "error": _error_json(
            "nvmlDeviceGetGpuFabricInfoV", exc)}
    status = int(info.status)
    return {
        "state": FABRIC_STATES.get(int(info.state) & 0xFF, f"unknown-{int(info.state)}"),
        "status": "success" if status == 0 else _nvml_error_text(pynvml, status),
    }


def _nvml_error_text(pynvml: Any, status: int) -> str:
    try:
        return f"{_text(pynvml.nvmlErrorString(status))} ({status})"
    except Exception:
        return f"NVML error {status}"


def _error_json(call: str, exc: BaseException) -> dict[str, str]:
    try:
        message = str(exc)
    except Exception:  # NVMLError.__str__ may call into a half-loaded library
        message = repr(exc)
    return {"call": call, "type": type(exc).__name__, "message": message}


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _loaded_library_path() -> Optional[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith("libnvidia-ml.so"):
                    return path
    except OSError:
        pass
    return None


def main() -> int:
    print(json.dumps(nvml_query()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
