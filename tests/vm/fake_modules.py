"""Builds the fake NVIDIA kernel modules (tests/kit/kernel) on this machine with kbuild."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

KIT_KERNEL_DIR = Path(__file__).resolve().parent.parent / "kit" / "kernel"
MODULE_FILES = ("nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko")


def make_command(kernel_build_dir: Path, module_dir: Path, **variables: str) -> list[str]:
    """The kbuild invocation, NVIDIA's way: make -C <kernel source> M=<module dir> ... modules."""
    assignments = [f"{name}={value}" for name, value in variables.items()]
    jobs = f"-j{os.cpu_count() or 1}"
    return ["make", "-C", str(kernel_build_dir), f"M={module_dir}", *assignments, jobs, "modules"]


def build_fake_modules(
    kernel_build_dir: Path, dest: Path, *, version: str, flavour: str, **variables: str
) -> Path:
    """Copies the kit sources to `dest`, builds them there and returns `dest`.

    Extra variables (NV_BUILD_UVM="0", ...) go to make. Raises CalledProcessError, with
    the compiler output, when the build fails.
    """
    shutil.copytree(KIT_KERNEL_DIR, dest)
    command = make_command(
        kernel_build_dir, dest, NV_VERSION=version, NV_FLAVOUR=flavour, **variables
    )
    subprocess.run(command, check=True, capture_output=True, text=True)
    return dest


def expected_gpu_uuid(address: str) -> str:
    """The GPU UUID the fake nvidia.ko reports for a PCI address (FNV-1a, as in nv-gpu-table.c)."""
    words = []
    for seed in range(4):
        value = 2166136261 ^ seed
        for byte in address.encode():
            value = ((value ^ byte) * 16777619) & 0xFFFFFFFF
        words.append(value)
    w0, w1, w2, w3 = words
    return f"GPU-{w0:08x}-{w1 >> 16:04x}-{w1 & 0xFFFF:04x}-{w2 >> 16:04x}-{w2 & 0xFFFF:04x}{w3:08x}"
