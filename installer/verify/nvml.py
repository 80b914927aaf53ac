"""NVML's answer, asked in a child process (`python -m installer.verify`, see child.py) so that
a crashing or hanging library cannot take the installer down."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

from installer.errors import CommandFailed, CommandNotFound
from installer.runner import Result, Runner
from installer.verify.report import GpuInfo, int_or_none, last_line, normalize_bus_id
from installer.verify.smi import NVML_SONAME

# The directory that holds the `installer` package: the child runs from there so that
# `-m installer.verify` imports this copy whether or not the package is pip-installed,
# and a stray `pynvml.py` or `installer/` in the caller's cwd cannot shadow it.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def nvml_argv() -> list[str]:
    return [sys.executable, "-m", "installer.verify"]


def check_library(lib_dir: Path) -> Optional[str]:
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


def query(
    env: dict[str, str],
    runner: Runner,
    timeout: float,
    problems: list[str],
) -> Optional[tuple[Optional[str], tuple[GpuInfo, ...], Optional[str]]]:
    asked = ask_child(nvml_argv(), runner, env=env, timeout=timeout, cwd=PACKAGE_PARENT,
                      what="NVML", command="python -m installer.verify", problems=problems)
    if asked is None:
        return None
    answer, result = asked
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
        problems.append(f"the NVML check answered without a driver version: {last_line(result)}")
        return None
    gpus: list[GpuInfo] = []
    for raw in answer.get("gpus") or []:
        gpu_error = raw.get("error")
        if isinstance(gpu_error, dict):
            problems.append(
                f"NVML {gpu_error.get('call', '?')} failed for GPU {raw.get('index')}: "
                f"{gpu_error.get('type', '?')}: {gpu_error.get('message', '')}"
            )
        fabric = raw.get("fabric") or {}
        gpus.append(
            GpuInfo(
                index=int(raw.get("index", len(gpus))),
                name=str(raw.get("name") or ""),
                uuid=str(raw.get("uuid") or ""),
                pci_bus_id=normalize_bus_id(str(raw.get("pci_bus_id") or "")),
                memory_total_mib=int_or_none(raw.get("memory_total_mib")),
                fabric_state=_str_or_none(fabric.get("state")),
                fabric_status=_str_or_none(fabric.get("status")),
                persistence_mode=_str_or_none(raw.get("persistence_mode")),
                mig_mode=_str_or_none(raw.get("mig_mode")),
                fabric_cluster_uuid=_str_or_none(fabric.get("cluster_uuid")),
                fabric_clique_id=int_or_none(fabric.get("clique_id")),
                fabric_health_mask=int_or_none(fabric.get("health_mask")),
                fabric_health_summary=_str_or_none(fabric.get("health_summary")),
            )
        )
    return str(version), tuple(gpus), library


def gpus(install_dir: Path, runner: Runner, timeout: float = 60
         ) -> tuple[tuple[GpuInfo, ...], list[str]]:
    """The GPUs as NVML reports them (with fabric state and persistence mode), asked in a
    child with the install dir's libraries, and what went wrong asking. Read-only."""
    lib_dir = Path(install_dir) / "lib64"
    problems: list[str] = []
    answer = query({"LD_LIBRARY_PATH": str(lib_dir)}, runner, timeout, problems)
    return (answer[1] if answer else ()), problems


def _str_or_none(value: object) -> Optional[str]:
    return value if isinstance(value, str) else None


def check_library_path(library: Optional[str], lib_dir: Path, problems: list[str]) -> None:
    # The dynamic loader falls back to the ld cache, so a stale host library could answer.
    if library is None:
        return
    if Path(library).resolve().parent != lib_dir.resolve():
        problems.append(f"NVML answered from {library}, not from the installed {lib_dir}")


def ask_child(argv: list[str], runner: Runner, *, env: dict[str, str], timeout: float,
              cwd: str, what: str, command: str,
              problems: list[str]) -> Optional[tuple[dict[str, Any], Result]]:
    """Runs a verify child (read-only) and returns the last JSON object it printed, with its
    result; None, and a problem naming the `what` check, when it did not run or gave no
    answer."""
    try:
        result = runner.run(argv, check=False, timeout=timeout, env=env, cwd=cwd)
    except (CommandNotFound, CommandFailed) as exc:
        problems.append(f"the {what} check did not run: {exc.message.splitlines()[0]}")
        return None
    answer = _last_json_object(result.output)
    if answer is None:
        problems.append(f"the {what} check ({command}) exited {result.returncode} without an "
                        f"answer: {last_line(result)}")
        return None
    return answer, result


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
