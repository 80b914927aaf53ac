"""NVSwitch systems: the switches' PCI functions, and the ones the loaded driver registered."""

from __future__ import annotations

import os
from typing import NamedTuple

from installer.host import NVIDIA_VENDOR_ID, pci_id
from installer.hostroot import HostRoot

# PCI class 0x0680, "bridge: other": NVIDIA's driver claims every NVIDIA function of this class
# as an NVSwitch (nvswitch_pci_table in the open kernel modules). HGX A100 boards carry LR10
# switches (10de:1af1, ...), HGX H100/H200 LS10 (10de:22a3, ...).
NVSWITCH_CLASS = 0x0680
# Registered by the driver once it drives a switch (the check NVIDIA's driver container makes).
DRIVER_DEVICES = "/proc/driver/nvidia-nvswitch/devices"
# GB200/GB300 (NVL72 racks): the switches sit in the rack's switch trays and are managed there,
# never by a Fabric Manager on the node.
OFF_HOST_FABRIC_GPUS = frozenset({0x2941, 0x31C2, 0x31C3})


class PciSwitch(NamedTuple):
    address: str
    device_id: int


def pci_switches(root: HostRoot) -> tuple[PciSwitch, ...]:
    """NVIDIA NVSwitch functions in /sys/bus/pci/devices (no driver needed), by address."""
    devices = root.local_resolved("/sys/bus/pci/devices")
    try:
        entries = sorted(os.listdir(devices))
    except OSError:
        return ()
    found = []
    for name in entries:
        if _hex(devices / name / "vendor") != NVIDIA_VENDOR_ID:
            continue
        klass = _hex(devices / name / "class")
        device_id = _hex(devices / name / "device")
        if klass is not None and klass >> 8 == NVSWITCH_CLASS and device_id is not None:
            found.append(PciSwitch(name, device_id))
    return tuple(found)


def driver_switches(root: HostRoot) -> tuple[str, ...]:
    """The switches the loaded driver registered (/proc/driver/nvidia-nvswitch/devices)."""
    try:
        return tuple(sorted(os.listdir(root.local(DRIVER_DEVICES))))
    except OSError:
        return ()


class Fabric(NamedTuple):
    """Whether this node's NVLink fabric needs a Fabric Manager on the node, and why."""

    switches: tuple[PciSwitch, ...]
    needed: bool
    reason: str


def fabric(root: HostRoot, gpu_device_ids: tuple[int, ...]) -> Fabric:
    """Reads sysfs only: a node with NVSwitch functions needs Fabric Manager, unless its GPUs
    are NVL72 parts whose switches are managed off the node."""
    switches = pci_switches(root)
    if not switches:
        return Fabric((), False, "no NVSwitch PCI function (class 0x0680, vendor 10de) in "
                      "/sys/bus/pci/devices")
    ids = ", ".join(sorted({pci_id(s.device_id) for s in switches}))
    off_host = sorted(i for i in gpu_device_ids if i in OFF_HOST_FABRIC_GPUS)
    if off_host:
        return Fabric(switches, False, f"{len(switches)} NVSwitch function(s) ({ids}), but the "
                      f"GPUs ({pci_id(off_host[0])}) are NVL72 parts whose fabric is managed "
                      "off the node")
    return Fabric(switches, True, f"{len(switches)} NVSwitch function(s) ({ids}) at "
                  f"{', '.join(s.address for s in switches)}")


def _hex(path: os.PathLike[str]) -> int | None:
    try:
        with open(path) as handle:
            return int(handle.read().strip(), 16)
    except (OSError, ValueError):
        return None
