"""Files a loaded NVIDIA driver would show, written under a directory for tests.

Point NVFAKE_TEST_ROOT (test-only; honoured by the kit's libnvidia-ml, libcuda and therefore
nvidia-smi) at the root to present a "loaded driver" without a kernel, or bind the subtrees over
the real paths with kit.sandbox.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import NamedTuple

TEST_ROOT_ENV = "NVFAKE_TEST_ROOT"
VERSION_LINE_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:23:56 UTC 2024"
)
VERSION_LINE_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Tue Mar  5 22:23:56 UTC 2024"
)
# The build date in those lines: date(1)'s default shape, a day before the 10th padded with a
# space ("Mar  5"), a later one not ("Mar 25").
BUILD_DATE_PATTERN = r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d UTC \d{4}"


class FakeGpu(NamedTuple):
    address: str  # PCI address as in /sys/bus/pci/devices, e.g. 0000:3b:00.0
    device_id: int
    model: str
    minor: int = 0


def write_pci_function(devices_dir: Path, address: str, device_id: int, pci_class: str,
                       subsystem_device: str) -> None:
    """A /sys/bus/pci/devices/<address> entry for an NVIDIA PCI function."""
    device = devices_dir / address
    device.mkdir(parents=True, exist_ok=True)
    (device / "vendor").write_text("0x10de\n")
    (device / "device").write_text(f"0x{device_id:04x}\n")
    (device / "class").write_text(f"{pci_class}\n")
    (device / "subsystem_vendor").write_text("0x10de\n")
    (device / "subsystem_device").write_text(f"{subsystem_device}\n")


def write_pci_gpu(devices_dir: Path, gpu: FakeGpu, pci_class: str = "0x030200") -> None:
    """A /sys/bus/pci/devices/<address> entry for an NVIDIA display controller."""
    write_pci_function(devices_dir, gpu.address, gpu.device_id, pci_class, "0x16c1")


def gpu_uuid(gpu: FakeGpu) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, gpu.address)}"


def write_loaded_driver(
    root: Path, version: str, gpus: list[FakeGpu], *, open_flavour: bool = True
) -> None:
    """/proc/driver/nvidia, /dev/nvidiactl and the GPUs' sysfs entries under root."""
    driver = root / "proc/driver/nvidia"
    (driver / "gpus").mkdir(parents=True, exist_ok=True)
    line = (VERSION_LINE_OPEN if open_flavour else VERSION_LINE_PROPRIETARY).format(version=version)
    (driver / "version").write_text(
        f"{line}\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    for gpu in gpus:
        info = driver / "gpus" / gpu.address
        info.mkdir(parents=True, exist_ok=True)
        (info / "information").write_text(
            f"Model: \t\t {gpu.model}\nIRQ:   \t\t 36\nGPU UUID: \t {gpu_uuid(gpu)}\n"
            "Video BIOS: \t 96.00.89.00.01\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
            f"DMA Mask: \t 0x7fffffffffff\nBus Location: \t {gpu.address}\n"
            f"Device Minor: \t {gpu.minor}\nGPU Excluded:\t No\n"
        )
        write_pci_gpu(root / "sys/bus/pci/devices", gpu)
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "dev/nvidiactl").touch()
    for gpu in gpus:  # libcuda opens each GPU's node (NVML and nvidia-smi only nvidiactl)
        (root / f"dev/nvidia{gpu.minor}").touch()
