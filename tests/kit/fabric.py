"""NVSwitch nodes for tests that run without the kit's kernel module: the switches' PCI
functions, the driver's /proc/driver/nvidia-nvswitch, and the per-GPU state the kit's module
exposes to its libnvidia-ml (gpus/<address>/nvfake-state, nv-gpu-state.c), under a root that
NVFAKE_TEST_ROOT (or a HostRoot) points at."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import NamedTuple

from kit.fake_host import FakeGpu, write_pci_function

# PCI class 0x0680 ("bridge: other"): how the driver recognises an NVIDIA NVSwitch.
NVSWITCH_CLASS = "0x068000"
H100_NVSWITCH = 0x22A3  # LS10, HGX H100/H200
A100_NVSWITCH = 0x1AF1  # LR10, HGX A100

# nvml.h's NVML_GPU_FABRIC_STATE_* and NVML_GPU_FABRIC_HEALTH_SUMMARY_* values.
NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED = 0, 1, 2, 3
HEALTH_NOT_SUPPORTED, HEALTHY, UNHEALTHY, LIMITED_CAPACITY = 0, 1, 2, 3
# The health mask's partition-assigned field (2 bits at shift 12): 2 = no partition assigned,
# what a GPU of a shared-NVSwitch (FABRIC_MODE=1) node shows until one is activated.
PARTITION_NOT_ASSIGNED = 2 << 12
# nvmlReturn_t the fabric manager leaves in a completed registration that failed.
NVML_ERROR_INSUFFICIENT_RESOURCES = 23


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
                    fabric_status: int = 0, cluster_uuid: str | None = None,
                    clique_id: int = 0, health_mask: int = 0,
                    health_summary: int = HEALTH_NOT_SUPPORTED, query_error: int = 0) -> None:
    """What the kit's module would report for one GPU (see nv-gpu-state.c). `cluster_uuid`
    (a UUID's text) and `clique_id` are what the fabric's manager assigned: NVML reports them
    once the state is COMPLETED. `query_error`: the nvmlReturn_t NVML's fabric query fails
    with instead (0: it answers)."""
    state = root / "proc/driver/nvidia/gpus" / address / "nvfake-state"
    state.parent.mkdir(parents=True, exist_ok=True)
    cluster = f"FabricClusterUuid: {uuid.UUID(cluster_uuid).hex}\n" if cluster_uuid else ""
    state.write_text(
        f"PersistenceMode: {int(persistence)}\nFabricSupported: {int(fabric_supported)}\n"
        f"FabricState: {fabric_state}\nFabricStatus: {fabric_status}\n{cluster}"
        f"FabricCliqueId: {clique_id}\nFabricHealthMask: {health_mask}\n"
        f"FabricHealthSummary: {health_summary}\n"
        + (f"FabricQueryError: {query_error}\n" if query_error else ""))


class Board(NamedTuple):
    """A board the kit can stand a node up as: its GPUs, its NVSwitch PCI functions, and
    whether its fabric is managed off the node (an NVL72 tray: its rack's switch trays)."""

    name: str
    gpus: tuple[FakeGpu, ...]
    switches: tuple[FakeSwitch, ...] = ()
    fabric_off_node: bool = False


def _gpus(device_id: int, model: str, count: int, domain_step: int = 0) -> tuple[FakeGpu, ...]:
    return tuple(FakeGpu(f"{i * domain_step:04x}:{0x18 + (0 if domain_step else i * 0x10):02x}"
                         ":00.0", device_id, model, i) for i in range(count))


# HGX B200/B300: eight GPUs, NVLink5 switches behind ConnectX-7 bridges (no NVIDIA 0x0680
# function on the host; the LPF ports are the NVLSM side's).
HGX_B200 = Board("HGX B200", _gpus(0x2901, "NVIDIA B200", 8))
HGX_B300 = Board("HGX B300", _gpus(0x3182, "NVIDIA B300 SXM6 AC", 8))
# A GB200/GB300 NVL72 compute tray: four GPUs beside two Grace CPUs, each GPU on its own PCI
# domain (as Grace's C2C links present them); no Fabric Manager runs here.
NVL72_GB200_TRAY = Board("NVL72 GB200 compute tray", _gpus(0x2941, "NVIDIA GB200", 4, 8),
                         fabric_off_node=True)
NVL72_GB300_TRAY = Board("NVL72 GB300 compute tray", _gpus(0x31C2, "NVIDIA GB300", 4, 8),
                         fabric_off_node=True)
GH200_NODE = Board("GH200", _gpus(0x2342, "NVIDIA GH200 480GB", 1))


def write_board_fabric(root: Path, board: Board, state: int, *, status: int = 0,
                       cluster_uuid: str | None = None, clique_id: int = 0,
                       health_mask: int = 0, health_summary: int = HEALTH_NOT_SUPPORTED) -> None:
    """Every GPU of `board` reports `state` (what its fabric's manager left): the cluster UUID
    and clique ID the test sets, as an NVL72 rack assigns them."""
    for gpu in board.gpus:
        write_gpu_state(root, gpu.address, fabric_state=state, fabric_status=status,
                        cluster_uuid=cluster_uuid, clique_id=clique_id,
                        health_mask=health_mask, health_summary=health_summary)
