"""An NVLink5 board's management side for fake hosts: ConnectX-7 (MT2910, 15b3:1021) PCI
functions with their binary PCI VPD (the Limited PF's says SMDL=SW_MNG), the IB device mlx5_ib
makes for each (/sys/class/infiniband/mlx5_N with node_guid and ports/1/gids/0), and a kernel
module tree that has (or lacks) the InfiniBand modules NVLSM needs."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

MELLANOX = 0x15B3
CX7 = 0x1021  # MT2910 Family [ConnectX-7]
INFINIBAND_CLASS = 0x020700
IB_MODULES = {
    "mlx5_core": "kernel/drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko",
    "mlx5_ib": "kernel/drivers/infiniband/hw/mlx5/mlx5_ib.ko",
    "ib_umad": "kernel/drivers/infiniband/core/ib_umad.ko",
}


class Cx7Port(NamedTuple):
    address: str  # its PCI function
    ib_device: str  # the name mlx5_ib gives it (mlx5_N)
    guid: int  # its port GUID (= node GUID on these single-port functions)
    lpf: bool = True  # a Limited PF (VPD SMDL=SW_MNG); else the port's full PF


def vpd(lpf: bool, serial: str = "MT2345X00001") -> bytes:
    """PCI VPD as the kernel's sysfs `vpd` file returns it: the identifier string (tag 0x82),
    the read-only section (0x90: PN, EC, SN, the vendor's VA field, RV checksum) and the end
    tag (0x78). A Limited PF's vendor field says SMDL=SW_MNG."""
    name = b"NVIDIA ConnectX-7 NVLink management bridge"
    va = b"MLX:MN=MLNX:CSKU=V2:UUID=V3:PCI=V0:MODL=CX750500B" + (b":SMDL=SW_MNG" if lpf else b"")
    fields = b""
    for key, value in ((b"PN", b"MCX750500B-0D00"), (b"EC", b"A7"), (b"SN", serial.encode()),
                       (b"VA", va)):
        fields += key + bytes([len(value)]) + value
    identifier = b"\x82" + struct.pack("<H", len(name)) + name
    header = b"\x90" + struct.pack("<H", len(fields) + 4)
    partial = identifier + header + fields + b"RV\x01"
    checksum = (-sum(partial)) & 0xFF  # the RV byte makes every byte up to it sum to zero
    return partial + bytes([checksum]) + b"\x78"


def _guid_text(guid: int, groups: int) -> str:
    digits = f"{guid:016x}".rjust(groups * 4, "0")
    return ":".join(digits[i:i + 4] for i in range(0, len(digits), 4))


def write_cx7_port(root: Path, port: Cx7Port, *, ib_loaded: bool = True) -> Path:
    """The PCI function under /sys/devices (linked from /sys/bus/pci/devices) and, with
    `ib_loaded` (mlx5_ib bound it), its IB device and /sys/class/infiniband link."""
    device = root / "sys/devices/pci0000:c0" / port.address
    device.mkdir(parents=True, exist_ok=True)
    (device / "vendor").write_text(f"{MELLANOX:#06x}\n")
    (device / "device").write_text(f"{CX7:#06x}\n")
    (device / "class").write_text(f"{INFINIBAND_CLASS:#08x}\n")
    (device / "vpd").write_bytes(vpd(port.lpf, f"MT2345X{port.guid & 0xFFFFF:05d}"))
    bus = root / "sys/bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    if not (bus / port.address).is_symlink():
        os.symlink(f"../../../devices/pci0000:c0/{port.address}", bus / port.address)
    if ib_loaded:
        ib = device / "infiniband" / port.ib_device
        (ib / "ports/1/gids").mkdir(parents=True, exist_ok=True)
        (ib / "node_guid").write_text(_guid_text(port.guid, 4) + "\n")
        (ib / "ports/1/gids/0").write_text("fe80:0000:0000:0000:" + _guid_text(port.guid, 4)
                                           + "\n")
        (ib / "ports/1/state").write_text("4: ACTIVE\n")
        os.symlink("../..", ib / "device")
        # ib_umad's class (libibumad looks for it before it opens /dev/infiniband/umadN).
        (root / "sys/class/infiniband_mad").mkdir(parents=True, exist_ok=True)
        (root / "sys/class/infiniband_mad/abi_version").write_text("5\n")
        klass = root / "sys/class/infiniband"
        klass.mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../devices/pci0000:c0/{port.address}/infiniband/{port.ib_device}",
                   klass / port.ib_device)
    return device


def hgx_b200_ports(base_guid: int = 0xB8CEF60300E61200) -> list[Cx7Port]:
    """The two CX7 bridges of an HGX B200 board as lspci shows them: a full PF and a Limited
    PF each."""
    return [Cx7Port("0000:c1:00.0", "mlx5_0", base_guid + 0, lpf=False),
            Cx7Port("0000:c1:00.1", "mlx5_1", base_guid + 1),
            Cx7Port("0000:c2:00.0", "mlx5_2", base_guid + 2, lpf=False),
            Cx7Port("0000:c2:00.1", "mlx5_3", base_guid + 3)]


def write_module_tree(root: Path, kernel: str, names: tuple[str, ...] = tuple(IB_MODULES)
                      ) -> None:
    """/lib/modules/<kernel>/modules.dep listing `names` (xz-compressed, as Ubuntu's and
    Debian's depmod writes them), each with its real dependency."""
    base = root / "lib/modules" / kernel
    base.mkdir(parents=True, exist_ok=True)
    deps = {"mlx5_ib": ["mlx5_core"], "ib_umad": []}
    lines = []
    for name in names:
        path = IB_MODULES[name] + ".xz"
        (base / path).parent.mkdir(parents=True, exist_ok=True)
        (base / path).write_bytes(b"")
        needs = " ".join(IB_MODULES[d] + ".xz" for d in deps.get(name, []) if d in names)
        lines.append(f"{path}: {needs}".rstrip())
    dep = base / "modules.dep"
    old = dep.read_text() if dep.exists() else ""
    dep.write_text(old + "".join(line + "\n" for line in lines))
