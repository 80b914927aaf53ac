"""NVSwitch systems: whether their switches (the host's fabric facts) need a Fabric Manager on
the node, and the switches the loaded driver registered."""

from __future__ import annotations

import os
from typing import NamedTuple

from installer.host import PciSwitch, pci_id
from installer.hostroot import HostRoot

# Registered by the driver once it drives a switch (the check NVIDIA's driver container makes).
DRIVER_DEVICES = "/proc/driver/nvidia-nvswitch/devices"
# GB200/GB300 (NVL72 racks): the switches sit in the rack's switch trays and are managed there,
# never by a Fabric Manager on the node.
OFF_HOST_FABRIC_GPUS = frozenset({0x2941, 0x31C2, 0x31C3})


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


def fabric(switches: tuple[PciSwitch, ...], gpu_device_ids: tuple[int, ...]) -> Fabric:
    """A node with NVSwitch functions (the host's fabric facts) needs Fabric Manager, unless
    its GPUs are NVL72 parts whose switches are managed off the node."""
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

