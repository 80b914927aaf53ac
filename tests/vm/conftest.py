"""Fixtures of the vm tier: the guest kernel, or a skip saying what this machine lacks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

from vm.guest_kernel import GuestKernel, find_guest_kernel
from vm.harness import QEMU
from vm.initramfs import BUSYBOX


def _missing(reason: str) -> NoReturn:
    # CI installs qemu, busybox and a kernel, so there a missing one fails the run.
    if os.environ.get("CI"):
        pytest.fail(f"the vm tier cannot run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def guest_kernel() -> GuestKernel:
    """The newest kernel in /boot with its modules (Debian's linux-image-amd64)."""
    kernel = find_guest_kernel()
    if kernel is None:
        _missing("no /boot/vmlinuz-* with /lib/modules (apt-get install linux-image-amd64)")
    return kernel


@pytest.fixture(scope="session")
def kernel_build_dir(guest_kernel: GuestKernel) -> Path:
    """The guest kernel's kbuild tree for external modules."""
    if not (guest_kernel.build_dir / "Makefile").is_file():
        headers = guest_kernel.build_dir
        _missing(f"no kernel headers at {headers} (apt-get install linux-headers-amd64)")
    return guest_kernel.build_dir


@pytest.fixture(scope="session")
def vm_kernel(guest_kernel: GuestKernel) -> GuestKernel:
    """The guest kernel, once qemu and busybox are known to be here to boot it."""
    if shutil.which(QEMU) is None:
        _missing(f"{QEMU} is not installed (apt-get install qemu-system-x86)")
    if not BUSYBOX.is_file():
        _missing(f"{BUSYBOX} is missing (apt-get install busybox-static)")
    return guest_kernel
