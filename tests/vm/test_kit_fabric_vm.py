"""The kit's nvidia.ko as Blackwell and Grace nodes show it, in a booted kernel (one boot):
an NVL72 GB200 compute tray whose fabric state, cluster UUID and clique ID are what the rack's
switch trays left (the test sets them under /sys/module/nvidia/parameters), and the 580
module's NVreg_CoherentGPUMemoryMode in /proc/driver/nvidia/params, read by the kit's
libnvidia-ml and by `installer verify` exactly as the host-side tests write those files."""

from __future__ import annotations

from pathlib import Path

import pytest

from vm.fake_modules import build_fake_modules
from vm.guest_kernel import GuestKernel
from vm.harness import FakeGpu, VmResult, boot_and_run

pytestmark = pytest.mark.vm

VERSION = "580.105.08"
TRAY = [FakeGpu(address="0000:00:04.0", device="0x2941"),
        FakeGpu(address="0000:00:05.0", device="0x2941")]
CLUSTER = "3f1c9a527be44d6e8a102c5f9e7b6d41"
PARAMS = "/sys/module/nvidia/parameters"

SCRIPT = f"""
mkdir -p /lib/firmware/nvidia/{VERSION}
echo "fake GSP firmware" > /lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin
insmod $VM_FILES/kit/nvidia.ko NVreg_CoherentGPUMemoryMode=driver
echo "@@ params"; grep Coherent /proc/driver/nvidia/params
echo "@@ not-started"; cat /proc/driver/nvidia/gpus/0000:00:04.0/nvfake-state
echo 2 > {PARAMS}/nvfake_rack_fabric_state
echo "@@ in-progress"; cat /proc/driver/nvidia/gpus/0000:00:05.0/nvfake-state
echo {CLUSTER} > {PARAMS}/nvfake_rack_cluster_uuid
echo 5 > {PARAMS}/nvfake_rack_clique_id
echo 3 > {PARAMS}/nvfake_rack_fabric_state
echo "@@ completed"; cat /proc/driver/nvidia/gpus/0000:00:04.0/nvfake-state
"""


@pytest.fixture(scope="module")
def tray(vm_kernel: GuestKernel, kernel_build_dir: Path,
         tmp_path_factory: pytest.TempPathFactory) -> VmResult:
    build = build_fake_modules(kernel_build_dir, tmp_path_factory.mktemp("kit") / "kit",
                               version=VERSION, flavour="open")
    result = boot_and_run(SCRIPT, gpus=TRAY, files={"kit": build}, timeout=240,
                          kernel=vm_kernel.release)
    assert result.exit_code == 0, result.console
    return result


def test_the_580_module_reports_its_coherent_memory_mode(tray: VmResult) -> None:
    assert tray.section("params").strip() == 'CoherentGPUMemoryMode: "driver"'


def test_a_trays_fabric_is_what_the_rack_left(tray: VmResult) -> None:
    assert tray.section("not-started").split("\n")[1:] == [
        "FabricSupported: 1", "FabricState: 1", "FabricStatus: 0", "FabricCliqueId: 0"]
    assert tray.section("in-progress").split("\n")[2] == "FabricState: 2"
    assert tray.section("completed").split("\n")[2:] == [
        "FabricState: 3", "FabricStatus: 0", f"FabricClusterUuid: {CLUSTER}",
        "FabricCliqueId: 5"]
