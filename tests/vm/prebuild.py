"""Modules compiled ahead on this machine by `installer prebuild` for the guest's kernel: what a
node finds in its module cache after a prebuild. Scenarios whose point is not the compile
(an upgrade's refusal, the protocol) start from these; the in-guest compile is proven once,
by each scenario's first install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def prebuild_modules(versions: list[str], mirror: Path, kernel: str, work: Path) -> Path:
    """The install dir's cache/modules after `installer prebuild --kernel <kernel>` of each
    version, the .run served from `mirror` (<mirror>/<version>/NVIDIA-Linux-*.run)."""
    for version in versions:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_", "ROOT_"))}
        env.update(PYTHONPATH=str(REPO), NVIDIA_INSTALL_DIR_HOST=str(work),
                   NVIDIA_INSTALL_DIR_CONTAINER=str(work), NVIDIA_DRIVER_VERSION=version,
                   NVIDIA_DRIVER_MIRRORS=mirror.as_uri(), NVIDIA_INSTALLER_FETCH_HEADERS="false")
        built = subprocess.run(
            [sys.executable, "-m", "installer", "prebuild", "--kernel", kernel],
            env=env, capture_output=True, text=True, timeout=600, check=False)
        if built.returncode != 0:
            raise RuntimeError(f"installer prebuild of {version} for {kernel} failed "
                               f"({built.returncode}):\n{built.stderr[-3000:]}")
    modules = work / "cache" / "modules"
    assert sorted(p.name for p in modules.iterdir()) == sorted(versions)
    return modules
