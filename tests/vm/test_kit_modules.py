"""The fake NVIDIA modules in a booted kernel: load, /proc and /sys, device numbers, refusals,
and NVIDIA's real nvidia-modprobe (Debian's package) making the device nodes against them.

Two boots serve every test here: one with two fake GPUs (V100 and H100), one with a K80.
A refused load leaves nothing behind, so one boot can try several builds in turn.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kit.fake_host import BUILD_DATE_PATTERN
from lib.realdriver import parts

from vm.fake_modules import build_fake_modules, expected_gpu_uuid
from vm.guest_kernel import GuestKernel
from vm.harness import FakeGpu, VmResult, boot_and_run

pytestmark = pytest.mark.vm

V100 = FakeGpu(address="0000:00:04.0", device="0x1db1")
H100 = FakeGpu(address="0000:00:05.0", device="0x2330")
K80 = FakeGpu(address="0000:00:04.0", device="0x102d")
BUILDS = {
    "proprietary-550": ("550.54.15", "proprietary"),
    "open-550": ("550.54.15", "open"),
    "proprietary-470": ("470.256.02", "proprietary"),
}

LOAD_ALL = """
insmod $VM_FILES/{build}/nvidia.ko NVreg_DeviceFileMode=0660 NVreg_DeviceFileGID=44 \
  NVreg_EnableGpuFirmware=0
insmod $VM_FILES/{build}/nvidia-uvm.ko uvm_disable_hmm=1
insmod $VM_FILES/{build}/nvidia-modeset.ko
insmod $VM_FILES/{build}/nvidia-drm.ko modeset=1
echo "@@ version"; cat /proc/driver/nvidia/version
echo "@@ sys-version"; cat /sys/module/nvidia/version
echo "@@ gpus"; ls /proc/driver/nvidia/gpus
for gpu in /proc/driver/nvidia/gpus/*; do
    echo "@@ information ${{gpu##*/}}"; cat "$gpu/information"
done
"""

NOTHING_REGISTERED = """
echo "registered:" $(grep -h nvidia /proc/modules /proc/devices; ls /proc/driver | grep nvidia)
"""

TWO_GPUS = f"""
echo "@@ open-v100"
insmod $VM_FILES/open-550/nvidia.ko 2>&1 || echo "insmod exit $?"
dmesg -t | grep 'NVRM: ' | tail -n 1
echo "@@ open-v100-leftovers"
{NOTHING_REGISTERED}
echo "@@ h100-470"
insmod $VM_FILES/proprietary-470/nvidia.ko 2>&1 || echo "insmod exit $?"
dmesg -t | grep 'NVRM: ' | tail -n 1
{NOTHING_REGISTERED}
{LOAD_ALL.format(build="proprietary-550")}
echo "@@ devices"; cat /proc/devices
echo "@@ params"; grep -H . /sys/module/nvidia*/parameters/* | sed 's|^/sys/module/||'
echo "@@ params-file"; cat /proc/driver/nvidia/params
echo "@@ dev-before-mknod"; ls /dev | grep nvidia || echo "no nvidia nodes"
mkdir -p /dev/char  # udev's, on a real host: nvidia-modprobe links each node there
echo "@@ real-nvidia-modprobe"
$VM_FILES/real-nvidia-modprobe --version | grep -m 1 version
$VM_FILES/real-nvidia-modprobe -c 0 -c 1 -c 255 && echo "nvidia nodes: ok"
$VM_FILES/real-nvidia-modprobe -u -c 0 && echo "uvm nodes: ok"
$VM_FILES/real-nvidia-modprobe -m && echo "modeset node: ok"
echo "@@ real-nodes"
stat -c '%n %F %t:%T %a %u:%g' /dev/nvidia* | sort
echo "@@ char-links"
for link in /dev/char/*; do
  [ -L "$link" ] && echo "$link -> $(readlink "$link")"
done | grep nvidia
mknod /dev/nvidia2 c 195 2
echo "@@ open-nodes"
(exec 4</dev/nvidiactl) && echo "nvidiactl opens"
(exec 4</dev/nvidia2) 2>&1 || echo "nvidia2 exit $?"
exec 3</dev/nvidia0
echo "@@ held"; grep '^nvidia ' /proc/modules
echo "@@ rmmod-held"
rmmod nvidia_drm nvidia_modeset nvidia_uvm
rmmod nvidia 2>&1 || echo "rmmod exit $?"
exec 3<&-
echo "@@ unloaded"
rmmod nvidia
{NOTHING_REGISTERED}
echo "@@ open-h100-no-firmware"
mkdir /tmp/h100-only && cp -r /sys/bus/pci/devices/{H100.address} /tmp/h100-only/
mount --bind /tmp/h100-only /sys/bus/pci/devices
insmod $VM_FILES/open-550/nvidia.ko 2>&1 || echo "insmod exit $?"
dmesg -t | grep 'NVRM: ' | tail -n 2
{NOTHING_REGISTERED}
echo "@@ open-h100-version"
mkdir -p /lib/firmware/nvidia/550.54.15
echo "fake GSP firmware" > /lib/firmware/nvidia/550.54.15/gsp_ga10x.bin
insmod $VM_FILES/open-550/nvidia.ko
cat /proc/driver/nvidia/version
rmmod nvidia
umount /sys/bus/pci/devices
echo "@@ no-gpu"
umount /sys/bus/pci/devices
insmod $VM_FILES/proprietary-550/nvidia.ko 2>&1 || echo "insmod exit $?"
dmesg -t | grep 'NVRM: ' | tail -n 1
{NOTHING_REGISTERED}
"""

ONE_K80 = f"""
echo "@@ k80-550"
insmod $VM_FILES/proprietary-550/nvidia.ko 2>&1 || echo "insmod exit $?"
dmesg -t | grep 'NVRM: ' | tail -n 1
{NOTHING_REGISTERED}
{LOAD_ALL.format(build="proprietary-470")}
echo "@@ unloaded"
rmmod nvidia_drm nvidia_modeset nvidia_uvm nvidia
{NOTHING_REGISTERED}
"""


@pytest.fixture(scope="module")
def kit_builds(kernel_build_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kit-builds")
    for name, (version, flavour) in BUILDS.items():
        build_fake_modules(kernel_build_dir, root / name, version=version, flavour=flavour)
    return root


def _boot(vm_kernel: GuestKernel, kit_builds: Path, script: str, gpus: list[FakeGpu]) -> VmResult:
    files = {name: kit_builds / name for name in BUILDS}
    files["real-nvidia-modprobe"] = parts().file("nvidia-modprobe")
    result = boot_and_run(script, gpus=gpus, files=files, timeout=240, kernel=vm_kernel.release)
    assert result.exit_code == 0, result.console
    return result


@pytest.fixture(scope="module")
def two_gpus(vm_kernel: GuestKernel, kit_builds: Path) -> VmResult:
    return _boot(vm_kernel, kit_builds, TWO_GPUS, [H100, V100])


@pytest.fixture(scope="module")
def one_k80(vm_kernel: GuestKernel, kit_builds: Path) -> VmResult:
    return _boot(vm_kernel, kit_builds, ONE_K80, [K80])


def _information(gpu: FakeGpu, model: str, minor: int) -> str:
    return (
        f"Model: \t\t {model}\n"
        "IRQ:   \t\t 0\n"
        f"GPU UUID: \t {expected_gpu_uuid(gpu.address)}\n"
        "Video BIOS: \t ??.??.??.??.??\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 47 bits\n"
        "DMA Mask: \t 0x7fffffffffff\n"
        f"Bus Location: \t {gpu.address}\n"
        f"Device Minor: \t {minor}\n"
        "GPU Excluded:\t No"
    )


def _nothing_registered(text: str) -> None:
    """No module, char device or /proc/driver entry of NVIDIA's is left."""
    assert "registered:" in text.splitlines(), text


def test_version_files_name_the_built_version(two_gpus: VmResult) -> None:
    first, second = two_gpus.section("version").splitlines()
    assert re.fullmatch(
        r"NVRM version: NVIDIA UNIX x86_64 Kernel Module  550\.54\.15  " + BUILD_DATE_PATTERN,
        first,
    )
    assert second.startswith("GCC version:  gcc version ")
    assert two_gpus.section("sys-version") == "550.54.15"


def test_open_flavour_starts_only_when_the_kernel_loads_its_gsp_firmware(
    two_gpus: VmResult,
) -> None:
    refused = two_gpus.section("open-h100-no-firmware")
    assert "insmod exit 1" in refused
    assert "NVRM: RmFetchGspRmImages: No firmware image found" in refused
    assert (f"NVRM: GPU {H100.address}: RmInitAdapter failed! "
            "(firmware nvidia/550.54.15/gsp_ga10x.bin: -2)") in refused
    assert refused.splitlines()[-1] == "registered:"


def test_open_flavour_version_names_the_build(two_gpus: VmResult) -> None:
    first, second = two_gpus.section("open-h100-version").splitlines()
    assert re.fullmatch(
        r"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550\.54\.15  Release Build  "
        r"\(\S+@\S+\)  " + BUILD_DATE_PATTERN,
        first,
    )
    assert re.fullmatch(r"GCC version:  gcc version \S.*\S", second)


def test_gpus_get_minors_in_pci_address_order(two_gpus: VmResult) -> None:
    assert two_gpus.section("gpus").split() == [V100.address, H100.address]
    assert two_gpus.section(f"information {V100.address}") == _information(
        V100, "Tesla V100-SXM2-16GB", 0
    )
    assert two_gpus.section(f"information {H100.address}") == _information(
        H100, "NVIDIA H100 80GB HBM3", 1
    )


def test_char_devices_are_registered_but_no_nodes_created(two_gpus: VmResult) -> None:
    devices = two_gpus.section("devices").splitlines()
    assert "195 nvidia" in devices
    assert any(re.fullmatch(r"\d+ nvidia-uvm", line) for line in devices)
    assert two_gpus.section("dev-before-mknod") == "no nvidia nodes"


def test_parameters_given_to_insmod_show_in_sysfs(two_gpus: VmResult) -> None:
    assert two_gpus.section("params").splitlines() == [
        "nvidia/parameters/NVreg_DeviceFileGID:44",
        "nvidia/parameters/NVreg_DeviceFileMode:432",
        "nvidia/parameters/NVreg_DeviceFileUID:0",
        "nvidia/parameters/NVreg_EnableGpuFirmware:0",
        "nvidia/parameters/NVreg_ModifyDeviceFiles:1",
        "nvidia/parameters/NVreg_OpenRmEnableUnsupportedGpus:0",
        "nvidia/parameters/NVreg_RestrictProfilingToAdminUsers:1",
        # The kit's stand-in for an NVL72 rack's switch trays (tests set them; kit/fabric.py).
        "nvidia/parameters/nvfake_rack_clique_id:0",
        "nvidia/parameters/nvfake_rack_fabric_state:1",
        "nvidia/parameters/nvfake_rack_fabric_status:0",
        "nvidia_drm/parameters/fbdev:0",
        "nvidia_drm/parameters/modeset:1",
        "nvidia_modeset/parameters/hdmi_deepcolor:Y",
        "nvidia_uvm/parameters/uvm_disable_hmm:Y",
    ]


def test_params_file_has_nvidias_format(two_gpus: VmResult) -> None:
    lines = two_gpus.section("params-file").splitlines()
    assert lines[:6] == ["ResmanDebugLevel: 4294967295", "RmLogonRC: 1", "ModifyDeviceFiles: 1",
                         "DeviceFileUID: 0", "DeviceFileGID: 44", "DeviceFileMode: 432"]
    assert lines[-6:] == ['RegistryDwords: ""', 'RegistryDwordsPerDevice: ""', 'RmMsg: ""',
                          'GpuBlacklist: ""', 'TemporaryFilePath: ""', 'ExcludedGpus: ""']


def test_nvidias_nvidia_modprobe_makes_the_nodes_the_kit_modules_ask_for(
    two_gpus: VmResult,
) -> None:
    """Debian's nvidia-modprobe reads /proc/driver/nvidia/params (mode, group) for the
    nvidia nodes and /proc/devices for nvidia-uvm's major, as with NVIDIA's driver."""
    said = two_gpus.section("real-nvidia-modprobe").splitlines()
    assert said[0].startswith("nvidia-modprobe:  version 535.")
    assert said[1:] == ["nvidia nodes: ok", "uvm nodes: ok", "modeset node: ok"]
    uvm = next(line.split()[0] for line in two_gpus.section("devices").splitlines()
               if line.endswith(" nvidia-uvm"))
    uvm_hex = f"{int(uvm):x}"
    assert two_gpus.section("real-nodes").splitlines() == [
        "/dev/nvidia-modeset character special file c3:fe 660 0:44",
        f"/dev/nvidia-uvm character special file {uvm_hex}:0 666 0:0",
        f"/dev/nvidia-uvm-tools character special file {uvm_hex}:1 666 0:0",
        "/dev/nvidia0 character special file c3:0 660 0:44",
        "/dev/nvidia1 character special file c3:1 660 0:44",
        "/dev/nvidiactl character special file c3:ff 660 0:44",
    ]
    links = two_gpus.section("char-links").splitlines()
    assert "/dev/char/195:255 -> ../nvidiactl" in links
    assert f"/dev/char/{uvm}:1 -> ../nvidia-uvm-tools" in links


def test_minor_without_a_gpu_cannot_be_opened(two_gpus: VmResult) -> None:
    opened = two_gpus.section("open-nodes")
    assert "nvidiactl opens" in opened
    assert "/dev/nvidia2: No such device" in opened


def test_open_device_holds_the_module_until_closed(two_gpus: VmResult) -> None:
    name, _size, refcount, users, *_ = two_gpus.section("held").split()
    assert name == "nvidia"
    assert int(refcount) > 2  # nvidia_uvm, nvidia_modeset and the open /dev/nvidia0
    assert users == "nvidia_modeset,nvidia_uvm,"
    assert "Module nvidia is in use" in two_gpus.section("rmmod-held")
    _nothing_registered(two_gpus.section("unloaded"))


def test_open_flavour_refuses_a_pre_turing_gpu(two_gpus: VmResult) -> None:
    refusal = two_gpus.section("open-v100")
    assert "insmod exit 1" in refusal
    assert "No such device" in refusal
    assert "NVRM: The NVIDIA GPU 0000:00:04.0 (PCI ID: 10de:1db1)" in refusal
    assert "not supported by open nvidia.ko" in refusal
    _nothing_registered(two_gpus.section("open-v100-leftovers"))


def test_hopper_needs_a_525_or_newer_driver(two_gpus: VmResult) -> None:
    refusal = two_gpus.section("h100-470")
    assert "No such device" in refusal
    assert (
        "NVRM: The NVIDIA GPU 0000:00:05.0 (PCI ID: 10de:2330) installed in this system is not "
        "supported by the NVIDIA 470.256.02 driver release." in refusal
    )
    _nothing_registered(refusal)


def test_no_gpu_means_no_such_device(two_gpus: VmResult) -> None:
    refusal = two_gpus.section("no-gpu")
    assert "No such device" in refusal
    assert "NVRM: No NVIDIA GPU found." in refusal
    _nothing_registered(refusal)


def test_k80_needs_the_470_legacy_branch(one_k80: VmResult) -> None:
    refusal = one_k80.section("k80-550")
    assert "No such device" in refusal
    assert "supported through the NVIDIA 470.xx Legacy drivers" in refusal
    _nothing_registered(refusal)

    assert one_k80.section("sys-version") == "470.256.02"
    assert one_k80.section("gpus") == K80.address
    assert one_k80.section(f"information {K80.address}") == _information(K80, "Tesla K80", 0)
    _nothing_registered(one_k80.section("unloaded"))
