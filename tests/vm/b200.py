"""An HGX B200 node for a booted guest: what the host builds (the kit's nvidia.ko, mlx5_core /
mlx5_ib / ib_umad as empty kbuild modules, the board's ConnectX-7 sysfs, Fabric Manager's and
NVLSM's archives) and the scenario lines that set it up. Used by tests/vm/test_hgx_b200_vm.py
and bench/bench_nvlink5.py --vm."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kit
from kit.fabricmanager import build_fabricmanager
from kit.nvlink5 import hgx_b200_ports, write_cx7_port
from kit.nvlsm import build_nvlsm

from vm.fake_modules import build_fake_modules, make_command
from vm.harness import FakeGpu

VERSION = "580.105.08"
SM = "2025.10.12"
BOARD = [FakeGpu(address="0000:00:04.0", device="0x2901"),
         FakeGpu(address="0000:00:05.0", device="0x2901")]
LPF_GUID = "0xb8cef60300e61201"  # hgx_b200_ports(): the first Limited PF, mlx5_1
REPO = Path(__file__).resolve().parents[2]
STATE = "/run/nvidia-driver-installer"
IB = ("mlx5_core", "mlx5_ib", "ib_umad")

# Fabric Manager and NVLSM into versions/<ver>/ as `installer run` puts them there (the same
# functions, on the guest's layout).
DELIVER = r"""
import os, sys, tempfile
from pathlib import Path
from installer.components import fm_archive, nvlsm_archive
from installer.config import from_env
from installer.hostroot import HostRoot
from installer.layout import Layout
layout = Layout.from_config(from_env(os.environ), HostRoot(Path("/")))
what, archive, version = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
driver = os.environ["NVIDIA_DRIVER_VERSION"]
work = Path(tempfile.mkdtemp())
if what == "fabricmanager":
    fm_archive.install(fm_archive.unpack(archive, work), layout.version_dir(driver),
                       fm_archive.config_dir(layout, driver), driver)
else:
    nvlsm_archive.unpack_and_install(archive, work, layout, driver, version)
"""

# The driver loaded and verified (its readiness file), the kit's NVML, nvidia-smi and Fabric
# Manager installed, the board's ConnectX-7 functions in the PCI tree (bound to no driver yet:
# no IB device) and /sys/class writable for the classes mlx5_ib and ib_umad add.
DRIVER = f"""
mkdir -p /lib/firmware/nvidia/{VERSION}
echo "fake GSP firmware" > /lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin
insmod $VM_FILES/kit/nvidia.ko
mknod -m 666 /dev/nvidiactl c 195 255
mknod -m 666 /dev/nvidia0 c 195 0
mknod -m 666 /dev/nvidia1 c 195 1
mkdir -p {STATE}
printf 'DRIVER_VERSION={VERSION}\\nINSTALL_DIR=/\\n' > {STATE}/driver-ready
cp -a $VM_FILES/install /run/inst
export PYTHONPATH={REPO} NVIDIA_INSTALL_DIR_HOST=/run/inst NVIDIA_DRIVER_VERSION={VERSION}
installer() {{ {sys.executable} -m installer "$@"; }}
deliver() {{ {sys.executable} $VM_FILES/board/deliver.py "$@"; }}
deliver fabricmanager $VM_FILES/www/fm/*.tar.xz {VERSION}
cp -a $VM_FILES/board/pci/. /run/vm-pci/
# Its relative links resolve as before; a few write-only files (gpio's export) are left out.
mkdir /run/sysclass
cp -a /sys/class/. /run/sysclass/ 2>/dev/null || true
mount --bind /run/sysclass /sys/class
"""

# The IB modules load: mlx5_ib makes an IB device per function, ib_umad its class.
IB_UP = f"""
for m in {" ".join(IB)}; do insmod $VM_FILES/ib/$m.ko; done
cp -a $VM_FILES/board/ib/. /run/vm-pci/
mkdir -p /sys/class/infiniband /sys/class/infiniband_mad
echo 5 > /sys/class/infiniband_mad/abi_version
for f in /run/vm-pci/*/infiniband/*; do ln -s "$f" /sys/class/infiniband/"${{f##*/}}"; done
"""

DELIVER_NVLSM = f"deliver nvlsm $VM_FILES/www/nvlsm/*.tar.xz {SM}\n"


def ib_modules(kernel_build_dir: Path, dest: Path) -> Path:
    """mlx5_core, mlx5_ib and ib_umad built by the guest kernel's kbuild: loading them is what
    /proc/modules shows the installer (nothing here drives a ConnectX-7; the scenario writes
    its sysfs)."""
    dest.mkdir(parents=True)
    for name in IB:
        (dest / f"{name}.c").write_text(
            "#include <linux/module.h>\n"
            f'MODULE_DESCRIPTION("test stand-in for {name}: loads and does nothing");\n'
            'MODULE_LICENSE("GPL");\n')
    (dest / "Kbuild").write_text("".join(f"obj-m += {name}.o\n" for name in IB))
    subprocess.run(make_command(kernel_build_dir, dest), check=True, capture_output=True)
    return dest


def prepare(work: Path, kernel_build_dir: Path) -> dict[str, Path]:
    """The guest's files (boot_and_run's `files`) under `work`."""
    build = build_fake_modules(kernel_build_dir, work / "kit", version=VERSION, flavour="open")
    ib = ib_modules(kernel_build_dir, work / "ib")
    install = kit.install_nvml(kit.extract_runfile(VERSION, work), work / "install", VERSION)
    www = work / "www"
    # Each archive under its own name: the installer unpacks it confined to that top dir.
    for name, archive in (("fm", build_fabricmanager(VERSION, work / "redist")),
                          ("nvlsm", build_nvlsm(SM, work / "redist", driver=VERSION))):
        (www / name).mkdir(parents=True)
        shutil.copy(archive, www / name / archive.name)
    board = write_board(work / "board", work / "sysfs")
    (board / "deliver.py").write_text(DELIVER)
    return {"kit": build, "install": install, "www": www, "board": board, "ib": ib}


def write_board(board: Path, work: Path) -> Path:
    """The board's ConnectX-7 functions for the guest's crafted PCI tree (one directory each):
    board/pci as before mlx5_ib binds them, board/ib with the IB device it makes for each."""
    board.mkdir(parents=True)
    for name, loaded in (("pci", False), ("ib", True)):
        for port in hgx_b200_ports():
            write_cx7_port(work / name, port, ib_loaded=loaded)
        (work / name / "sys/devices/pci0000:c0").rename(board / name)
    return board


def assert_fabric_manager_started_on_nvlsm(log: str) -> None:
    """The fabricmanager container's log shows Fabric Manager started only once NVLSM's socket was
    there: the supervisor's start line, then Fabric Manager's first line, then its connection to
    NVLSM on the Limited PF. (NVLSM's own "SUBNET UP" line races the supervisor's: both follow the
    socket's bind, so only its presence is asserted.)"""
    assert "[nvlsm] SUBNET UP" in log, log[-3000:]
    lines = log.splitlines()
    started = next(index for index, line in enumerate(lines) if
                   "opened /var/run/nvidia-fabricmanager/fm_sm_ipc.socket; starting" in line)
    first_of_fm = next(index for index, line in enumerate(lines)
                       if line.split(None, 2)[2:] and line.split(None, 2)[2].startswith(
                           "nv-fabricmanager: "))
    connected = next(index for index, line in enumerate(lines)
                     if f"Connected to NVLink Subnet Manager on port GUID {LPF_GUID}" in line)
    assert started < first_of_fm < connected, log[-3000:]
