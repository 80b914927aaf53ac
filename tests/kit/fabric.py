"""NVSwitch nodes for tests that run without the kit's kernel module: the switches' PCI
functions, the driver's /proc/driver/nvidia-nvswitch, and the per-GPU state the kit's module
exposes to its libnvidia-ml (gpus/<address>/nvfake-state, nv-gpu-state.c), under a root that
NVFAKE_TEST_ROOT (or a HostRoot) points at."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from kit.fake_host import write_pci_function

# PCI class 0x0680 ("bridge: other"): how the driver recognises an NVIDIA NVSwitch.
NVSWITCH_CLASS = "0x068000"
H100_NVSWITCH = 0x22A3  # LS10, HGX H100/H200
A100_NVSWITCH = 0x1AF1  # LR10, HGX A100

# nvml.h's NVML_GPU_FABRIC_STATE_* values.
NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED = 0, 1, 2, 3


class FakeSwitch(NamedTuple):
    address: str
    device_id: int = H100_NVSWITCH


def write_pci_switch(devices_dir: Path, switch: FakeSwitch) -> None:
    """A /sys/bus/pci/devices/<address> entry for an NVSwitch function."""
    write_pci_function(devices_dir, switch.address, switch.device_id, NVSWITCH_CLASS, "0x1796")


def write_driver_switches(root: Path, switches: list[FakeSwitch]) -> None:
    """/proc/driver/nvidia-nvswitch as the loaded driver lays it out."""
    base = root / "proc/driver/nvidia-nvswitch"
    (base / "devices").mkdir(parents=True, exist_ok=True)
    (base / "permissions").write_text("DeviceFileMode: 438\n")
    for switch in switches:
        info = base / "devices" / switch.address
        info.mkdir(parents=True, exist_ok=True)
        (info / "information").write_text("BIOS Version: N/A\n")


def write_gpu_state(root: Path, address: str, *, persistence: bool = False,
                    fabric_supported: bool = True, fabric_state: int = NOT_SUPPORTED,
                    fabric_status: int = 0) -> None:
    """What the kit's module would report for one GPU (see nv-gpu-state.c)."""
    state = root / "proc/driver/nvidia/gpus" / address / "nvfake-state"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(
        f"PersistenceMode: {int(persistence)}\nFabricSupported: {int(fabric_supported)}\n"
        f"FabricState: {fabric_state}\nFabricStatus: {fabric_status}\n")
