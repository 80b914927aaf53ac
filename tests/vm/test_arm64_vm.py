"""Debian's real arm64 kernel (6.1.0-47-arm64) booted under qemu-system-aarch64 (TCG, `virt`,
Cortex-A57), one boot: NVIDIA's real arm64 535.261.03 nvidia.ko, cross-built on this x86
machine by `installer prebuild --arch aarch64`, is accepted by the arm64 kernel (its vermagic
and symbols match), finds no NVIDIA GPU on the PCI bus (qemu's edu device is there), logs
`NVRM: No NVIDIA GPU found.` and is not left loaded."""

from __future__ import annotations

import shutil

import pytest
from lib.arm64kit import KERNEL, arm64, cross_build

from vm.arm64_guest import QEMU, Arm64Guest
from vm.harness import VmResult

pytestmark = pytest.mark.vm

SCENARIO = """
echo "@@ machine"
uname -m
uname -r
echo "@@ pci"
for d in /sys/bus/pci/devices/*; do echo "$(cat $d/vendor) $(cat $d/device)"; done
echo "@@ load"
insmod /modules/nvidia.ko
echo "insmod exit $?"
echo "@@ modules"
cat /proc/modules
"""


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> VmResult:
    if shutil.which(QEMU) is None:
        pytest.fail(f"{QEMU} is not installed (scripts/install-deps: qemu-system-arm)")
    build, result = cross_build(tmp_path_factory, "proprietary")
    assert result.returncode == 0, result.stderr[-4000:]
    guest = Arm64Guest(arm64())
    nvidia = build / "nvidia.ko"
    needed = guest.depends([nvidia], tmp_path_factory.mktemp("arm64-depmod"))
    return guest.boot(SCENARIO, needed, [nvidia])


def test_the_guest_is_debians_arm64_kernel_with_a_pci_device(booted: VmResult) -> None:
    assert booted.exit_code == 0, booted.console[-3000:]
    assert booted.section("machine").split() == ["aarch64", KERNEL]
    assert "0x1234 0x11e8" in booted.section("pci")  # qemu's edu on virt's PCIe bus


def test_the_real_cross_built_nvidia_ko_finds_no_gpu_and_is_not_left_loaded(
        booted: VmResult) -> None:
    assert "insmod exit 0" not in booted.section("load")
    # The kernel took the module (no vermagic or symbol refusal): NVIDIA's own code ran (its
    # messages reach the console: the sections leave kernel lines out).
    assert "NVRM: No NVIDIA GPU found." in booted.console
    assert "No such device" in booted.section("load")
    assert "Unknown symbol" not in booted.console
    assert "disagrees about version" not in booted.console
    assert "vm: insmod" not in booted.console  # every dependency (drm, ...) loaded
    modules = [line.split()[0] for line in booted.section("modules").splitlines() if line]
    assert "nvidia" not in modules
    assert "drm" in modules
