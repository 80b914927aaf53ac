"""An arm64 node: Debian's real arm64 kernel under qemu-system-aarch64 (TCG, `virt`, Cortex-A57)
booted on an arm64 Debian root (tests/vm/arm64_root.py) on a virtio disk, with qemu's user
network (this machine's 127.0.0.1 is the guest's 10.0.2.2) and qemu's edu device on the PCI bus.

The initramfs is busybox and the modules that reach the root (virtio-pci, virtio-blk, ext4,
virtio-net); /sbin/vm-node on the root then runs the scenario with `bash -e` and reports its
exit code on the console. As in the x86 tier, the PCI ids the installer and the kit's nvidia.ko
read come from a crafted copy of /sys/bus/pci/devices bind-mounted over it: edu's own entry, at
edu's address, says NVIDIA (STAND_IN), while the kernel's PCI core still sees edu (NVIDIA's
real nvidia.ko asks the PCI core and finds no GPU).
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from kit.arm64_parts import KERNEL, Arm64Parts

from vm import arm64_root
from vm.arm64_guest import DONE, KERNEL_CMDLINE, QEMU, busybox_init, run_to_exit_code
from vm.harness import VmResult

# The initramfs's modules (loaded in this order) and the root's module tree: what reaches the
# root, and drm, which NVIDIA's real nvidia.ko needs (modprobe resolves it from modules.dep).
BOOT_MODULES = ("virtio_pci", "virtio_blk", "virtio_net", "crc32c_generic", "ext4")
TREE_MODULES = (*BOOT_MODULES, "drm", "drm_kms_helper")
# edu's ids (qemu's educational device) and what the crafted tree shows at its address: an H100.
EDU = ("0x1234", "0x11e8")
STAND_IN = {"vendor": "0x10de", "device": "0x2330", "class": "0x030200",
            "subsystem_vendor": "0x10de", "subsystem_device": "0x16c1"}
# The initramfs mounts the root and hands over to the node's own boot (NODE).
INIT = busybox_init("/newroot", """\
mount -t ext4 /dev/vda /newroot || { echo "vm: no root"; poweroff -f; }
umount /proc /sys /dev
exec switch_root /newroot /sbin/vm-node
""")
NODE = """#!/bin/bash
# The node's own boot: file systems, the ld cache, the network, the crafted PCI tree, then the
# scenario; its exit code goes to the console and the node powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/busybox
export HOME=/root LC_ALL=C.UTF-8 TERM=dumb VM_FILES=/vm
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /usr/local/busybox
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
/bin/busybox --install -s /usr/local/busybox
hostname arm64-node
ldconfig
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
tree=/run/vm-pci
mkdir -p $tree
for dev in /sys/bus/pci/devices/*; do
    mkdir "$tree/${dev##*/}"
    for attr in vendor device class subsystem_vendor subsystem_device irq; do
        cat "$dev/$attr" > "$tree/${dev##*/}/$attr"
    done
    if [ "$(cat $dev/vendor) $(cat $dev/device)" = "{edu}" ]; then
        {stand_in}
    fi
done
mount --bind $tree /sys/bus/pci/devices
echo "vm: scenario starts"
cd /root
bash -e /vm/scenario.sh < /dev/null
echo "{done} $?"
sync
poweroff -f
"""


def initramfs(parts: Arm64Parts, modules: list[Path], work: Path) -> Path:
    root = work / "initramfs"
    for name in ("bin", "modules"):
        (root / name).mkdir(parents=True)
    shutil.copy2(parts.busybox, root / "bin/busybox")
    (root / "init").write_text(INIT)
    (root / "init").chmod(0o755)
    for ko in modules:
        shutil.copy2(ko, root / "modules" / ko.name)
    (root / "modules/order").write_text("".join(f"{ko.stem}\n" for ko in modules))
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    cpio = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc", "--owner=0:0"], cwd=root,
                          input=("\n".join(names) + "\n").encode(), check=True,
                          capture_output=True)
    image = work / "initramfs.cpio.gz"
    image.write_bytes(gzip.compress(cpio.stdout, compresslevel=1))
    return image


def module_index(parts: Arm64Parts, work: Path) -> Path:
    """A base directory whose lib/modules/<kernel> is the arm64 kernel's tree (hard links)
    with depmod's files, which the cached tree lacks (it is never written to)."""
    tree = work / "index/lib/modules" / KERNEL
    tree.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(parts.modules / "kernel"), str(tree / "kernel")],
                   check=True)
    for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        shutil.copy2(parts.modules / name, tree / name)
    subprocess.run(["depmod", "-b", str(work / "index"), KERNEL], check=True)
    return work / "index"


def module_paths(index: Path, names: tuple[str, ...]) -> list[Path]:
    """The kernel's .ko files for `names` and their dependencies, in load order (this machine's
    modprobe over the arm64 tree's modules.dep)."""
    shown = subprocess.run(
        ["modprobe", "-d", str(index), "-S", KERNEL, "--show-depends", "-a", *names],
        check=True, capture_output=True, text=True).stdout
    found: list[Path] = []
    for line in shown.splitlines():
        words = line.split()
        if words[:1] == ["insmod"] and Path(words[1]) not in found:
            found.append(Path(words[1]))
    return found


def build_root(parts: Arm64Parts, scenario: str, files: Mapping[str, Path], work: Path
               ) -> tuple[Path, str]:
    """The node's root disk image and the PYTHONPATH of its installer."""
    tarball = arm64_root.require()
    root = arm64_root.unpack(tarball, work / "root")
    python_path = arm64_root.add_installer(root)
    index = module_index(parts, work)
    modules = index / "lib/modules" / KERNEL
    tree = [str(p.relative_to(modules)) for p in module_paths(index, TREE_MODULES)]
    arm64_root.add_module_tree(root, modules, KERNEL, tree)
    stand_in = "\n        ".join(f'echo {value} > "$tree/${{dev##*/}}/{attr}"'
                                 for attr, value in STAND_IN.items())
    node = NODE.replace("{edu}", " ".join(EDU)).replace("{stand_in}", stand_in) \
        .replace("{done}", DONE)
    (root / "sbin/vm-node").write_text(node)
    (root / "sbin/vm-node").chmod(0o755)
    (root / "vm").mkdir()
    (root / "vm/scenario.sh").write_text(scenario)
    for name, source in files.items():
        if source.is_dir():
            shutil.copytree(source, root / "vm" / name, symlinks=True)
        else:
            shutil.copy2(source, root / "vm" / name)
    arm64_root.precompile(root)
    disk = arm64_root.make_disk(root, work / "root.ext4")
    shutil.rmtree(root)
    return disk, python_path


def boot(parts: Arm64Parts, disk: Path, work: Path, *, timeout: float = 1500) -> VmResult:
    """Boot the node on `disk` until its scenario reports an exit code (or `timeout`)."""
    index = work / "index"
    image = initramfs(parts, module_paths(index, BOOT_MODULES), work)
    argv = [QEMU, "-M", "virt", "-cpu", "cortex-a57", "-smp", "1", "-m", "1536",
            "-nographic", "-no-reboot", "-kernel", str(parts.vmlinuz), "-initrd", str(image),
            "-append", KERNEL_CMDLINE,
            "-drive", f"if=none,id=root,format=raw,file={disk}",
            "-device", "virtio-blk-pci,drive=root",
            "-netdev", "user,id=net", "-device", "virtio-net-pci,netdev=net",
            "-device", "edu"]
    return run_to_exit_code(argv, "node", timeout, work / "console.log")


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="arm64-node."))
