"""The kit's nvidia-smi, libnvidia-ml and libcuda of one version installed into a directory
once per test file, for the tests that ask them through installer.verify."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def tools_missing() -> str | None:
    """Why the kit cannot build its user space here (gcc, makeself, ldconfig), or None."""
    for tool in ("gcc", "makeself", "ldconfig"):
        if shutil.which(tool) is None and shutil.which(tool, path="/sbin:/usr/sbin") is None:
            return f"{tool} is not installed"
    return None


def skip_without_tools() -> pytest.MarkDecorator:
    return pytest.mark.skipif(tools_missing() is not None, reason=str(tools_missing()))


def installed(factory: pytest.TempPathFactory, version: str) -> Path:
    """<install>/bin and lib64 with the kit's nvidia-smi, NVML and libcuda (sonames linked)."""
    from kit import extract_runfile, install_nvml

    work = factory.mktemp("runfile")
    return install_nvml(extract_runfile(version, work), work / "install", version)
