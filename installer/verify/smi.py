"""nvidia-smi's answer: the argv we run and its csv rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from installer.errors import CommandFailed, CommandNotFound
from installer.runner import Runner
from installer.verify.report import BUS_ID, GpuInfo, int_or_none, last_line, normalize_bus_id

SMI_QUERY = "driver_version,name,uuid,pci.bus_id,memory.total"
SMI_EXIT_NO_DRIVER = 9
SMI_EXIT_NOT_FOUND = 6
SMI_EXIT_NO_LIBRARY = 12
NVML_SONAME = "libnvidia-ml.so.1"


def smi_argv(install_dir: Path) -> list[str]:
    return [
        str(Path(install_dir) / "bin" / "nvidia-smi"),
        f"--query-gpu={SMI_QUERY}",
        "--format=csv,noheader,nounits",
    ]


def query(
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
        problems.append(f"nvidia-smi failed with exit {result.returncode}: {last_line(result)}")
        return None, ()
    version, gpus = parse_smi_csv(result.output)
    if version is None:
        problems.append(f"nvidia-smi printed no GPU rows: {last_line(result)}")
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
        if len(fields) < 5 or BUS_ID.match(fields[-2]) is None:
            continue
        if version is None:
            version = fields[0]
        gpus.append(
            GpuInfo(
                index=len(gpus),
                name=", ".join(fields[1:-3]),
                uuid=fields[-3],
                pci_bus_id=normalize_bus_id(fields[-2]),
                memory_total_mib=int_or_none(fields[-1]),
            )
        )
    return version, tuple(gpus)
