"""NVIDIA's real 535.261.03 nvidia.ko in a booted Debian kernel with no NVIDIA GPU (one boot).

The modules are the session's real build for Debian's 6.1.0-56 headers (the integration tier's,
compiled once through `installer run`; built here when this tier runs alone), the guest kernel
is Debian's 6.1.0-56. NVIDIA's module needs drm first (insmod alone fails on its symbols;
modprobe after depmod resolves them), then finds no GPU on the PCI bus, logs
`NVRM: No NVIDIA GPU found.` and refuses to load. `installer run` on a node whose sysfs shows a
GPU (simulated; the kernel's PCI bus has none) must report that refusal as a clear error and
leave the node as it was: no half-activated install, no readiness file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lib.realdriver import VERSION, RealInstall, proprietary_install

from vm.guest_kernel import GuestKernel
from vm.harness import FakeGpu, VmResult, boot_and_run

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
INSTALL = "/home/kubernetes/bin/nvidia"
H100 = FakeGpu(address="0000:00:04.0", device="0x2330")

SCENARIO = f"""
K=$(uname -r)
BUILD={INSTALL}/cache/modules/{VERSION}/$K/proprietary
mkdir -p {INSTALL}/cache/modules/{VERSION}/$K {INSTALL}/versions
cp -a $VM_FILES/build $BUILD
cp -a $VM_FILES/userspace {INSTALL}/versions/{VERSION}
echo "@@ insmod-alone"
insmod $BUILD/nvidia.ko 2>&1 || echo "insmod exit $?"
dmesg -t | grep -m 3 'Unknown symbol' || true
echo "@@ run"
rc=0
env PYTHONPATH={REPO} NVIDIA_INSTALL_DIR_HOST={INSTALL} NVIDIA_DRIVER_VERSION={VERSION} \\
  NVIDIA_KERNEL_MODULE_TYPE=proprietary \\
  NVIDIA_DRIVER_DOWNLOAD_URL=file:///nonexistent/NVIDIA-Linux-x86_64-{VERSION}.run \\
  {sys.executable} -m installer run 2>&1 || rc=$?
echo "exit=$rc"
echo "@@ kernel"
dmesg -t | grep -E 'NVRM|nvidia' || true
echo "@@ loaded"
cut -d' ' -f1 /proc/modules | grep -E '^(nvidia|drm)' | sort || true
echo "@@ after"
ls -A {INSTALL}
echo "@@ host"
ls /lib/modules/$K/updates 2>&1 || true
ls /lib/firmware/nvidia 2>&1 || true
ls /etc/ld.so.conf.d/nvidia-driver-installer.conf 2>&1 || true
ls /run/nvidia-driver-installer/driver-ready 2>&1 || true
"""


@pytest.fixture(scope="module")
def refused(vm_kernel: GuestKernel, tmp_path_factory: pytest.TempPathFactory) -> VmResult:
    built: RealInstall = proprietary_install(tmp_path_factory)
    assert built.result.returncode == 0, built.result.stderr[-5000:]
    assert vm_kernel.release == built.kernel, (vm_kernel.release, built.kernel)
    files = {"build": built.build_dir, "userspace": built.install / "versions" / VERSION}
    result = boot_and_run(SCENARIO, gpus=[H100], files=files, timeout=1200,
                          state_dir=tmp_path_factory.mktemp("real-vm-state"),
                          kernel=vm_kernel.release)
    assert result.exit_code == 0, result.console[-5000:]
    return result


def test_nvidias_module_needs_drm_first(refused: VmResult) -> None:
    section = refused.section("insmod-alone")
    assert "insmod exit 1" in section
    assert "Unknown symbol in module" in section
    assert "nvidia: Unknown symbol drm_" in section


def test_the_kernel_finds_no_gpu_and_refuses_the_module(refused: VmResult) -> None:
    kernel = refused.section("kernel")
    assert "NVRM: No NVIDIA GPU found." in kernel
    assert "nvidia-nvlink: Nvlink Core is being initialized" in kernel
    assert "nvidia" not in refused.section("loaded").split()
    assert "drm" in refused.section("loaded").split()  # modprobe loaded the dependency


def test_the_installer_reports_the_refusal_as_a_clear_error(refused: VmResult) -> None:
    run = refused.section("run")
    assert run.splitlines()[-1] == "exit=35"
    assert "error[module-load-failed]" in run
    assert "the kernel logged: " in run and "NVRM: No NVIDIA GPU found." in run
    assert "hint: The driver found no NVIDIA GPU it can drive on this node" in run
    assert "Traceback" not in run


def test_the_node_is_left_as_it_was(refused: VmResult) -> None:
    assert "put back: " in refused.section("run")
    left = refused.section("after").split()
    for link in ("current", "bin", "lib64", "drivers", "state.json"):
        assert link not in left, left
    host = refused.section("host")
    # Neither directory was there before (this machine's root has no NVIDIA driver): a first
    # install made them, the rollback takes them again.
    assert "/updates': No such file or directory" in host, host
    assert "cannot access '/lib/firmware/nvidia': No such file or directory" in host, host
    assert "cannot access '/etc/ld.so.conf.d/nvidia-driver-installer.conf'" in host
    assert "cannot access '/run/nvidia-driver-installer/driver-ready'" in host
