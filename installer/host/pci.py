"""NVIDIA GPUs on the PCI bus, from sysfs (no driver needed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from installer.hostroot import HostRoot

NVIDIA_VENDOR_ID = 0x10DE
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


def _read_hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def nvidia_gpus(root: HostRoot) -> tuple[PciGpu, ...]:
    """NVIDIA display/3D functions from /sys/bus/pci/devices, sorted by address.

    Audio and bridge functions of NVIDIA cards are ignored. Reads sysfs only.
    """
    devices = root.local_resolved("/sys/bus/pci/devices")
    try:
        entries = sorted(os.listdir(devices))
    except OSError:
        return ()
    found: list[PciGpu] = []
    for name in entries:
        # The per-device links are relative (../../../devices/pci...), so plain local
        # path resolution stays inside the root; one HostRoot.resolve per file is not needed.
        device_dir = devices / name
        if _read_hex(device_dir / "vendor") != NVIDIA_VENDOR_ID:
            continue
        class_code = _read_hex(device_dir / "class")
        if class_code is None or (class_code >> 8) not in _GPU_CLASS_PREFIXES:
            continue
        device_id = _read_hex(device_dir / "device")
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
                subsystem_vendor=_read_hex(device_dir / "subsystem_vendor"),
                subsystem_device=_read_hex(device_dir / "subsystem_device"),
                bound_driver=driver,
            )
        )
    return tuple(found)
