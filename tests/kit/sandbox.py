"""Run a command in a private mount namespace so it can "write to /usr" without touching the host.

Overlays make host directories writable with the writes kept in upper dirs the test inspects;
binds replace a path (a fake /proc, /dev or /sys/bus/pci/devices) for that command only.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

MOUNT_SCRIPT_TAIL = 'exec "$@"'


def available() -> bool:
    """True when this process may create mount namespaces (root with CAP_SYS_ADMIN)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def upper_dir(work: Path, host_dir: str) -> Path:
    """Where writes to an overlaid host_dir end up."""
    return work / "upper" / host_dir.strip("/")


def run(
    argv: Sequence[str],
    *,
    work: Path,
    overlays: Sequence[str] = (),
    binds: Optional[Mapping[str, Path]] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    lines = ["set -e"]
    for host_dir in overlays:
        upper = upper_dir(work, host_dir)
        scratch = work / "overlay-work" / host_dir.strip("/")
        upper.mkdir(parents=True, exist_ok=True)
        scratch.mkdir(parents=True, exist_ok=True)
        lines.append(
            f"mount -t overlay overlay -o lowerdir={host_dir},upperdir={upper},"
            f"workdir={scratch} {host_dir}"
        )
    for target, source in (binds or {}).items():
        lines.append(f"mount --bind {source} {target}")
    lines.append(MOUNT_SCRIPT_TAIL)
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", "\n".join(lines), "sandbox", *argv],
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else None,
        timeout=timeout,
        check=False,
    )
