"""PCI functions from sysfs (no driver needed): the one scan of /sys/bus/pci/devices by vendor,
and NVIDIA's GPUs among them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from installer.hostroot import HostRoot

NVIDIA_VENDOR_ID = 0x10DE
MELLANOX_VENDOR_ID = 0x15B3
PCI_DEVICES = "/sys/bus/pci/devices"
# PCI base class 03 (display): 0x0300 VGA controller, 0x0302 3D controller (headless
# data-center GPUs). NVIDIA cards also expose audio (0x0403) and bridge functions.
_GPU_CLASS_PREFIXES = (0x0300, 0x0302)


def pci_id(device_id: int) -> str:
    """An NVIDIA function's `vendor:device`, as lspci and NVIDIA's support lists write it."""
    return f"10de:{device_id:04x}"


class PciGpu(NamedTuple):
    """One NVIDIA display/3D function found in sysfs (no driver needed)."""

    address: str
    device_id: int
    class_code: int
    subsystem_vendor: int | None = None
    subsystem_device: int | None = None
    bound_driver: str | None = None

    @property
    def pci_id(self) -> str:
        return pci_id(self.device_id)


def read_hex(path: Path) -> int | None:
    """A sysfs attribute written in hex (vendor, device, class), or None when unreadable."""
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def vendor_functions(root: HostRoot, vendor: int) -> tuple[tuple[str, Path], ...]:
    """The PCI functions of `vendor` in /sys/bus/pci/devices, sorted by address: each address
    with its sysfs directory here, for the caller to read further. Reads sysfs only."""
    devices = root.local_resolved(PCI_DEVICES)
    try:
        entries = sorted(os.listdir(devices))
    except OSError:
        return ()
    # The per-device links are relative (../../../devices/pci...), so plain local path
    # resolution stays inside the root; one HostRoot.resolve per file is not needed.
    return tuple((name, devices / name) for name in entries
                 if read_hex(devices / name / "vendor") == vendor)


def nvidia_gpus(root: HostRoot) -> tuple[PciGpu, ...]:
    """NVIDIA display/3D functions from /sys/bus/pci/devices, sorted by address.

    Audio and bridge functions of NVIDIA cards are ignored. Reads sysfs only.
    """
    found: list[PciGpu] = []
    for name, device_dir in vendor_functions(root, NVIDIA_VENDOR_ID):
        class_code = read_hex(device_dir / "class")
        if class_code is None or (class_code >> 8) not in _GPU_CLASS_PREFIXES:
            continue
        device_id = read_hex(device_dir / "device")
        if device_id is None:
            continue
        try:
            driver: str | None = os.path.basename(os.readlink(device_dir / "driver"))
        except OSError:
            driver = None
        found.append(
            PciGpu(
                address=name,
                device_id=device_id,
                class_code=class_code,
                subsystem_vendor=read_hex(device_dir / "subsystem_vendor"),
                subsystem_device=read_hex(device_dir / "subsystem_device"),
                bound_driver=driver,
            )
        )
    return tuple(found)
