"""An NVL72 GB200 compute tray in a booted kernel (one boot): the kit's nvidia.ko reports the
fabric state, cluster UUID and clique ID the rack's switch trays left (the test sets them
under /sys/module/nvidia/parameters) and the 580 module's NVreg_CoherentGPUMemoryMode in
/proc/driver/nvidia/params. With the kit's NVML and nvidia-smi (the driver taken as verified):
while the fabric is in progress `installer verify` fails naming the switch trays and
`installer fabricmanager` writes no readiness file and ends in fabric-not-ready past its
bound; once completed the file appears and verify reports the clique and coherent memory."""

from __future__ import annotations

import sys
from pathlib import Path

import kit
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
REPO = Path(__file__).resolve().parents[2]
# verify --json's lines a test reads: ok, clique, coherent memory, then problems and reasons.
SHOW = (r'import json, sys; d = json.load(open(sys.argv[1])); '
        r'print(d["ok"], d["fabric"]["clique"], d["coherent_memory"]); '
        r'print(*d["problems"], sep="\n")')
STATE = "/run/nvidia-driver-installer"

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
# The installer's view: the driver verified (its readiness file), the kit's NVML and nvidia-smi.
echo 2 > {PARAMS}/nvfake_rack_fabric_state
mknod -m 666 /dev/nvidiactl c 195 255
mknod -m 666 /dev/nvidia0 c 195 0
mknod -m 666 /dev/nvidia1 c 195 1
mkdir -p {STATE}
printf 'DRIVER_VERSION={VERSION}\nINSTALL_DIR=/\n' > {STATE}/driver-ready
export PYTHONPATH={REPO} NVIDIA_INSTALL_DIR_HOST=$VM_FILES/install
export NVIDIA_DRIVER_VERSION={VERSION} SHOW='{SHOW}'
installer() {{ {sys.executable} -m installer "$@"; }}
show() {{ {sys.executable} -c "$SHOW" "$1"; }}
echo "@@ verify-in-progress"
installer verify --json > /tmp/in-progress.json 2>/tmp/verify.err || echo "exit $?"
show /tmp/in-progress.json
echo "@@ fabricmanager-gives-up"
NVIDIA_INSTALLER_FABRIC_TIMEOUT=5 installer fabricmanager 2>/tmp/fm.log || echo "exit $?"
grep -o 'error.fabric-not-ready.: the NVLink fabric is not complete after 5 s' /tmp/fm.log
ls {STATE}
echo 3 > {PARAMS}/nvfake_rack_fabric_state
installer fabricmanager 2>/tmp/fm2.log &
for _ in $(seq 60); do test -f {STATE}/fabricmanager-ready && break; sleep 1; done
echo "@@ fabricmanager-ready"; cat {STATE}/fabricmanager-ready
kill %1; wait %1 || true
echo "@@ verify-completed"
installer verify --json > /tmp/completed.json || echo "exit $?"
show /tmp/completed.json
"""


@pytest.fixture(scope="module")
def tray(vm_kernel: GuestKernel, kernel_build_dir: Path,
         tmp_path_factory: pytest.TempPathFactory) -> VmResult:
    work = tmp_path_factory.mktemp("kit")
    build = build_fake_modules(kernel_build_dir, work / "kit", version=VERSION, flavour="open")
    install = kit.install_nvml(kit.extract_runfile(VERSION, work), work / "install", VERSION)
    result = boot_and_run(SCRIPT, gpus=TRAY, files={"kit": build, "install": install},
                          timeout=480, kernel=vm_kernel.release)
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


def test_in_progress_the_node_is_not_ready_and_the_wait_is_bounded(tray: VmResult) -> None:
    verify, summary, *problems = tray.section("verify-in-progress").splitlines()
    assert verify == "exit 40" and summary == "False None driver"
    assert problems[:-1] == [
        f"GPU {i} ({gpu.address}): NVLink fabric in-progress, not completed (CUDA fails with "
        "error 802, system not yet initialized)" for i, gpu in enumerate(TRAY)] + [
        "the fabric is not complete because the GPUs (10de:2941) are NVL72 parts whose fabric "
        "the rack's switch trays bring up (NVLSM, Fabric Manager and NMX-C there, not on this "
        "node)"]
    # The CUDA check sees the same: the kit's libcuda answers 802 while the fabric is not up.
    assert problems[-1].startswith("CUDA cuInit failed: CUDA_ERROR_SYSTEM_NOT_READY (802)")
    gave_up = tray.section("fabricmanager-gives-up").splitlines()
    assert gave_up[:2] == ["exit 46", "error[fabric-not-ready]: the NVLink fabric is not "
                                      "complete after 5 s"]
    assert gave_up[2:] == ["driver-ready"]  # no fabricmanager-ready


def test_completed_the_file_appears_with_the_clique(tray: VmResult) -> None:
    assert tray.section("fabricmanager-ready").splitlines() == [
        f"DRIVER_VERSION={VERSION}", "STATE=fabric-complete",
        "REASON=no NVSwitch PCI function (class 0x0680, vendor 10de) in /sys/bus/pci/devices",
        "FABRIC=completed"]
    assert tray.section("verify-completed").strip() == \
        "True 3f1c9a52-7be4-4d6e-8a10-2c5f9e7b6d41.5 driver"
