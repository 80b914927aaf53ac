"""Boots Debian's real arm64 kernel under qemu-system-aarch64 (TCG, `virt` machine, Cortex-A57)
from an initramfs of Debian's arm64 busybox and the given modules, and runs a shell scenario.

The x86 tier boots on this machine's root over 9p; an arm64 guest cannot run this machine's
programs, so its whole user space is the initramfs: busybox, the modules to load (with their
dependencies, ordered by this machine's depmod/modprobe over the arm64 module tree) and the
scenario. Sections are printed as `@@ <name>` lines, as the x86 tier's are.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kit.arm64_parts import KERNEL, Arm64Parts

from vm.harness import SECTION_MARKER, VmError, VmResult

QEMU = "qemu-system-aarch64"
KERNEL_CMDLINE = "console=ttyAMA0 panic=-1 loglevel=4 rdinit=/init"
DONE = "vm: scenario exit code"


def busybox_init(directory: str, then: str) -> str:
    """An initramfs's /init: busybox's applets, the kernel's file systems (and `directory`
    made), the modules named in /modules/order inserted in that order, then `then`."""
    return f"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev {directory}
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules/order); do insmod /modules/$m.ko || echo "vm: insmod $m failed"; done
{then}"""


INIT = busybox_init("/tmp", f"""\
sh /scenario.sh
echo "{DONE} $?"
poweroff -f
""")


@dataclass(frozen=True)
class Arm64Guest:
    parts: Arm64Parts

    def depends(self, extra: list[Path], work: Path) -> list[Path]:
        """The arm64 kernel's own .ko files that `extra` modules need, in load order."""
        tree = work / "lib/modules" / KERNEL
        tree.mkdir(parents=True)
        subprocess.run(["cp", "-al", str(self.parts.modules / "kernel"), str(tree / "kernel")],
                       check=True)
        for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
            shutil.copy2(self.parts.modules / name, tree / name)
        (tree / "extra").mkdir()
        for ko in extra:
            shutil.copy2(ko, tree / "extra" / ko.name)
        subprocess.run(["depmod", "-b", str(work), KERNEL], check=True)
        shown = subprocess.run(
            ["modprobe", "-d", str(work), "-S", KERNEL, "--show-depends", "-a",
             *(ko.stem for ko in extra)], check=True, capture_output=True, text=True).stdout
        found: list[Path] = []
        for line in shown.splitlines():
            words = line.split()
            if words[:1] == ["insmod"]:
                path = Path(words[1])
                if "/extra/" not in str(path) and path not in found:
                    found.append(path)
        return found

    def boot(self, scenario: str, modules: list[Path], extra: list[Path], *,
             timeout: float = 900) -> VmResult:
        """Boot with `modules` loaded first (the arm64 kernel's) and `extra` copied to
        /modules/ for the scenario to load; returns the console once the scenario ended."""
        with tempfile.TemporaryDirectory(prefix="arm64-guest.") as scratch:
            root = Path(scratch) / "root"
            for name in ("bin", "modules"):
                (root / name).mkdir(parents=True)
            shutil.copy2(self.parts.busybox, root / "bin/busybox")
            (root / "init").write_text(INIT)
            (root / "init").chmod(0o755)
            (root / "scenario.sh").write_text(scenario)
            order = []
            for ko in [*modules, *extra]:
                shutil.copy2(ko, root / "modules" / ko.name)
                if ko in modules:
                    order.append(ko.name.removesuffix(".ko"))
            (root / "modules/order").write_text("\n".join(order) + "\n")
            initramfs = Path(scratch) / "initramfs.cpio.gz"
            names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
            cpio = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc", "--owner=0:0"],
                                  cwd=root, input=("\n".join(names) + "\n").encode(),
                                  check=True, capture_output=True)
            initramfs.write_bytes(gzip.compress(cpio.stdout, compresslevel=1))
            argv = [QEMU, "-M", "virt", "-cpu", "cortex-a57", "-smp", "2", "-m", "1536",
                    "-nographic", "-no-reboot", "-kernel", str(self.parts.vmlinuz),
                    "-initrd", str(initramfs), "-append", KERNEL_CMDLINE,
                    # A PCI device that is no NVIDIA GPU: qemu's edu, on virt's PCIe host bridge.
                    "-device", "edu"]
            return run_to_exit_code(argv, "guest", timeout)


def run_to_exit_code(argv: list[str], what: str, timeout: float,
                     log: Path | None = None) -> VmResult:
    """Run qemu (`argv`) until the machine powers off; the scenario's exit code is what its
    console's DONE line says. `log` keeps the console (with the test's temporary files)."""
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        raise VmError(f"the arm64 {what} did not finish in {timeout} s", out) from exc
    console = (done.stdout + done.stderr).replace("\r", "")
    if log is not None:
        log.write_text(console)
    for line in console.splitlines():
        if line.startswith(DONE):
            code = int(line.removeprefix(DONE).strip())
            return VmResult(code, console, time.monotonic() - started)
    raise VmError(f"the arm64 {what} never reported its scenario's exit code", console)


__all__ = ["SECTION_MARKER", "Arm64Guest"]
