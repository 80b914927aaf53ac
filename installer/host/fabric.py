"""The NVLink fabric's hardware as sysfs shows it (no driver needed): NVSwitch PCI functions
(HGX A100/H100/H200) and the ConnectX-7 Limited PF ports that manage an NVLink5 board's switches
(HGX B200/B300). Read once with the host's other facts; what it means for Fabric Manager and
NVLSM is the components' to say."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from installer.host.pci import MELLANOX_VENDOR_ID, NVIDIA_VENDOR_ID, read_hex, vendor_functions
from installer.hostroot import HostRoot

# PCI class 0x0680, "bridge: other": NVIDIA's driver claims every NVIDIA function of this class
# as an NVSwitch (nvswitch_pci_table in the open kernel modules). HGX A100 boards carry LR10
# switches (10de:1af1, ...), HGX H100/H200 LS10 (10de:22a3, ...).
NVSWITCH_CLASS = 0x0680
# On NVLink5 boards the switches sit behind ConnectX-7 bridges (MT2910). Each port has a full PF
# and a Limited PF; the LPF's VPD carries SMDL=SW_MNG: NVLSM and Fabric Manager manage the
# NVLink switches through it (what NVIDIA's driver container greps for).
SW_MNG = b"SW_MNG"
_GID = r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$"
_NODE_GUID = r"^[0-9a-f]{4}(:[0-9a-f]{4}){3}$"


class PciSwitch(NamedTuple):
    address: str
    device_id: int


class LpfPort(NamedTuple):
    """A Limited PF of a ConnectX-7 bridge: its PCI function, its IB device once mlx5_ib made
    one, and the port GUID NVLSM and Fabric Manager are given (None until then)."""

    address: str
    device_id: int
    ib_device: str | None
    guid: str | None  # 0x + 16 hex digits


class FabricHardware(NamedTuple):
    """The NVLink fabric's hardware on this node: its NVSwitch functions and its LPF ports."""

    switches: tuple[PciSwitch, ...]
    lpf_ports: tuple[LpfPort, ...]


def fabric_hardware(root: HostRoot) -> FabricHardware:
    return FabricHardware(pci_switches(root), lpf_ports(root))


def pci_switches(root: HostRoot) -> tuple[PciSwitch, ...]:
    """NVIDIA NVSwitch functions in /sys/bus/pci/devices (no driver needed), by address."""
    found = []
    for name, function in vendor_functions(root, NVIDIA_VENDOR_ID):
        klass = read_hex(function / "class")
        device_id = read_hex(function / "device")
        if klass is not None and klass >> 8 == NVSWITCH_CLASS and device_id is not None:
            found.append(PciSwitch(name, device_id))
    return tuple(found)


def lpf_ports(root: HostRoot) -> tuple[LpfPort, ...]:
    """The Mellanox PCI functions whose VPD says SW_MNG, by address. Reads sysfs only: the PCI
    function's vpd is there before mlx5_ib is loaded (/sys/class/infiniband/*/device/vpd, where
    NVIDIA's driver container looks, is the same file once it is)."""
    found = []
    for name, function in vendor_functions(root, MELLANOX_VENDOR_ID):
        try:
            vpd = (function / "vpd").read_bytes()
        except OSError:  # no VPD capability, or unreadable: not an LPF we can tell
            continue
        if SW_MNG not in vpd:
            continue
        ib_device, guid = _port_guid(function)
        found.append(LpfPort(name, read_hex(function / "device") or 0, ib_device, guid))
    return tuple(found)


def _port_guid(function: Path) -> tuple[str | None, str | None]:
    """Port 1's GUID of the IB device mlx5_ib made for this PCI function: the interface id of
    its GID 0 (fe80::<port GUID>), else the node GUID (the same on a single-port LPF)."""
    try:
        names = sorted(os.listdir(function / "infiniband"))
    except OSError:
        return None, None
    if not names:
        return None, None
    ib = function / "infiniband" / names[0]
    gid = _read(ib / "ports" / "1" / "gids" / "0")
    if gid is not None and re.match(_GID, gid) and not gid.endswith("0000:0000:0000:0000"):
        return names[0], "0x" + gid.replace(":", "")[16:]
    node = _read(ib / "node_guid")
    if node is not None and re.match(_NODE_GUID, node) and node != "0000:0000:0000:0000":
        return names[0], "0x" + node.replace(":", "")
    return names[0], None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip().lower()
    except OSError:
        return None
