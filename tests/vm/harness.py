"""Boots a real Linux kernel under qemu on this machine's root and runs a bash scenario in it."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vm.guest_kernel import GuestKernel, find_guest_kernel
from vm.initramfs import GUEST_DIR, build_initramfs
from vm.module_tree import module_tree

QEMU = "qemu-system-x86_64"
# Kernel errors (NVRM refusals among them) reach the console; the rest stays in dmesg.
KERNEL_CMDLINE = "console=ttyS0 panic=-1 loglevel=4 mitigations=off"
STATE_DISK_BYTES = 2 << 30
SECTION_MARKER = "@@ "
# Under TCG the guest kernel now and then locks up both vCPUs in runc's container start (seen
# 2026-11-25: runc and runc init each stuck in the kernel, never in the installer or the kit's
# modules). The watchdog says so about 25 s in; the boot is then retried once.
LOCKUP = "watchdog: BUG: soft lockup"
LOCKUP_RETRIES = 1
KERNEL_LINE = re.compile(r"^\[\s*\d+\.\d+\] ")


@dataclass(frozen=True)
class FakeGpu:
    """A PCI device the guest sees in /sys/bus/pci/devices; only its sysfs files exist."""

    address: str = "0000:00:04.0"
    device: str = "0x2330"
    vendor: str = "0x10de"
    klass: str = "0x030200"
    subsystem_vendor: str = "0x10de"
    subsystem_device: str = "0x16c1"


@dataclass(frozen=True)
class VmResult:
    exit_code: int
    console: str
    duration: float

    def section(self, name: str) -> str:
        """What the scenario printed after `echo "@@ <name>"`, up to the next marker.

        Kernel messages on the console (timestamped lines) are left out. Raises KeyError
        when the scenario never printed the marker.
        """
        lines: list[str] | None = None
        for line in self.console.splitlines():
            if line == SECTION_MARKER + name:
                lines = []
            elif lines is not None and (
                line.startswith(SECTION_MARKER) or line.startswith("vm: scenario exit code")
            ):
                break
            elif lines is not None and not KERNEL_LINE.match(line):
                lines.append(line)
        if lines is None:
            raise KeyError(f"no section {name!r} in the console:\n{self.console[-3000:]}")
        return "\n".join(lines)


@dataclass(frozen=True)
class BootAndReboot:
    """What a guest's scenario printed on its first boot and on its reboot from the same state
    disk (boot_and_run's state_dir)."""

    first: VmResult
    second: VmResult


class VmError(RuntimeError):
    """The guest never reported an exit code: boot failure, panic or timeout."""

    def __init__(self, message: str, console: str) -> None:
        super().__init__(f"{message}\n--- console tail ---\n{console[-4000:]}")
        self.console = console


class GuestLockup(VmError):
    """The guest kernel's watchdog reported a soft lockup; qemu was stopped at once."""


def boot_and_run(
    script: str,
    *,
    state_dir: Path | None = None,
    gpus: Sequence[FakeGpu] | None = None,
    files: Mapping[str, Path] | None = None,
    timeout: float = 180.0,
    kernel: str | GuestKernel | None = None,
    memory: int = 1024,
) -> VmResult:
    """Boots the guest, runs `script` with `bash -e` as root in it, powers it off.

    state_dir: host directory holding the guest's writes to its root filesystem; booting
    again with the same directory is a reboot. gpus: when given, the guest's
    /sys/bus/pci/devices is a crafted tree with its real devices plus these. files: copied
    into the guest's $VM_FILES (/run/vm/files) under their names. kernel: a release in this
    machine's /boot (default: the newest), or a GuestKernel unpacked elsewhere. Raises VmError
    when the guest reports no exit code within `timeout` seconds; qemu is always killed and
    reaped. memory: the guest's RAM in MiB (its root's overlay is tmpfs there too).
    """
    guest = kernel if isinstance(kernel, GuestKernel) else find_guest_kernel(kernel)
    if guest is None:
        raise VmError(f"no bootable kernel {kernel or ''} in /boot with /lib/modules", "")
    disk = state_disk(state_dir) if state_dir is not None else None
    before = disk.with_name(disk.name + ".before-boot") if disk is not None else None
    if disk is not None and before is not None:
        _copy_sparse(disk, before)  # a retried boot starts from the same disk
    try:
        for attempt in range(LOCKUP_RETRIES + 1):
            run_dir = Path(tempfile.mkdtemp(prefix="installer-vm-run-"))
            try:
                _prepare_run_dir(run_dir, script, gpus, files, module_tree(guest))
                command = _qemu_command(guest, run_dir, state_dir, memory=memory)
                return _run_qemu(command, run_dir, timeout)
            except GuestLockup as lockup:
                if attempt == LOCKUP_RETRIES:
                    raise
                warnings.warn(f"guest kernel soft lockup (qemu stopped), the boot is retried "
                              f"once from the same disk: {lockup.console[-600:]}", stacklevel=2)
                if disk is not None and before is not None:
                    _copy_sparse(before, disk)
            finally:
                _keep_console(run_dir)
                shutil.rmtree(run_dir, ignore_errors=True)
        raise AssertionError("unreachable")
    finally:
        if before is not None:
            before.unlink(missing_ok=True)


def _keep_console(run_dir: Path) -> None:
    """With INSTALLER_VM_CONSOLES=<dir>, each boot's console is kept there (named by the test
    and the time): where a scenario spent its time, what a passing run printed."""
    keep = os.environ.get("INSTALLER_VM_CONSOLES")
    console = run_dir / "console.log"
    if not keep or not console.is_file():
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "boot").split(" ")[0]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in test)[-120:]
    Path(keep).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(console, Path(keep) / f"{time.strftime('%Y%m%dT%H%M%S')}-{name}.log")


def _copy_sparse(source: Path, dest: Path) -> None:
    subprocess.run(["cp", "--sparse=always", str(source), str(dest)], check=True)


def _prepare_run_dir(
    run_dir: Path,
    script: str,
    gpus: Sequence[FakeGpu] | None,
    files: Mapping[str, Path] | None,
    modules: Path | None,
) -> None:
    shutil.copy2(GUEST_DIR / "stage2.sh", run_dir / "stage2.sh")
    (run_dir / "scenario.sh").write_text(script)
    if modules is not None:
        (run_dir / "module-tree").write_text(f"{modules}\n")
    if gpus is not None:
        (run_dir / "gpus").write_text(
            "".join(
                f"{gpu.address} {gpu.vendor} {gpu.device} {gpu.klass} "
                f"{gpu.subsystem_vendor} {gpu.subsystem_device}\n"
                for gpu in gpus
            )
        )
    (run_dir / "files").mkdir()
    for name, source in (files or {}).items():
        if source.is_dir():
            shutil.copytree(source, run_dir / "files" / name, symlinks=True)
        else:
            shutil.copy2(source, run_dir / "files" / name)


def state_disk(state_dir: Path) -> Path:
    """The guest's persistent disk in `state_dir`, made (empty ext4, sparse) on first use.

    A disk rather than a 9p share: overlayfs needs whiteouts (device nodes, which qemu
    refuses to open on a share) and trusted.* xattrs (not passed by security_model=none).
    """
    disk = state_dir / "root.ext4"
    if not disk.is_file():
        state_dir.mkdir(parents=True, exist_ok=True)
        with open(disk, "wb") as image:
            image.truncate(STATE_DISK_BYTES)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "vmstate", str(disk)], check=True)
    return disk


def _share(tag: str, path: Path, slot: int, *, readonly: bool = False) -> list[str]:
    fsdev = f"local,id={tag},path={path},security_model=none,multidevs=remap"
    if readonly:
        fsdev += ",readonly=on"
    # High slots keep the shares away from the low addresses tests give fake GPUs.
    device = f"virtio-9p-pci,fsdev={tag},mount_tag={tag},addr={slot:#x}"
    return ["-fsdev", fsdev, "-device", device]


def _qemu_command(guest: GuestKernel, run_dir: Path, state_dir: Path | None, *,
                  memory: int = 1024) -> list[str]:
    accel = accelerator(guest)
    cmdline = KERNEL_CMDLINE
    devices = _share("hostroot", Path("/"), 0x1D, readonly=True) + _share("vmrun", run_dir, 0x1E)
    if state_dir is not None:
        disk = ["-drive", f"if=none,id=state,format=raw,file={state_disk(state_dir)}"]
        devices += [*disk, "-device", "virtio-blk-pci,drive=state,addr=0x1f"]
        cmdline += " vm.state=1"
    return [
        QEMU,
        "-nodefaults",
        "-no-reboot",
        "-display", "none",
        "-accel", accel,
        "-cpu", "max",
        "-smp", str(vcpus(accel)),
        "-m", str(memory),
        "-kernel", str(guest.image),
        "-initrd", str(build_initramfs(guest)),
        "-append", cmdline,
        "-serial", f"file:{run_dir / 'console.log'}",
        *devices,
    ]  # fmt: skip


def vcpus(accel: str) -> int:
    """One vCPU under TCG: with two, qemu's threads spent 46% more CPU time on the same
    in-guest compile of tests/kit/kernel (241 s against 165 s, measured with this machine's
    2 cores busy as in CI, where two guests run at once and each has a core at most)."""
    if accel == "tcg":
        return 1
    return min(2, os.cpu_count() or 1)


@functools.cache
def accelerator(guest: GuestKernel) -> str:
    """kvm when a quick boot to a kernel panic works with it, else tcg.

    /dev/kvm may exist yet fail under nested virtualisation (qemu aborts on an MSR,
    or the guest spins), so only a real boot tells.
    """
    forced = os.environ.get("INSTALLER_VM_ACCEL")
    if forced:
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    probe = [
        QEMU, "-nodefaults", "-no-reboot", "-display", "none", "-accel", "kvm",
        "-cpu", "max", "-m", "256", "-kernel", str(guest.image),
        "-append", "console=ttyS0 panic=-1", "-serial", "none",
    ]  # fmt: skip
    try:
        subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=20, check=True)
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError):
        return "tcg"
    return "kvm"


def _run_qemu(command: list[str], run_dir: Path, timeout: float) -> VmResult:
    started = time.monotonic()
    with open(run_dir / "qemu.log", "wb") as qemu_log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=qemu_log, stderr=subprocess.STDOUT
        )
        locked_up = False
        try:
            while time.monotonic() - started < timeout and process.poll() is None:
                try:
                    process.wait(timeout=min(5.0, max(0.1, timeout - (time.monotonic() - started))))
                except subprocess.TimeoutExpired:
                    locked_up = LOCKUP in _read_text(run_dir / "console.log")
                    if locked_up:
                        break
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    duration = time.monotonic() - started
    console = _read_text(run_dir / "console.log") + _read_text(run_dir / "qemu.log")
    if locked_up:
        raise GuestLockup(f"the guest kernel locked up after {duration:.0f}s", console)
    exit_code_file = run_dir / "exit_code"
    if not exit_code_file.is_file():
        reason = "timed out" if duration >= timeout else f"qemu exited {process.returncode}"
        raise VmError(f"the guest reported no exit code ({reason} after {duration:.0f}s)", console)
    return VmResult(int(exit_code_file.read_text()), console, duration)


def _read_text(path: Path) -> str:
    if not path.is_file():
        return ""
    return path.read_text(errors="replace").replace("\r\n", "\n")
