"""Read-only facts about the host: distro, kernel, arch, NVIDIA GPUs, modules, Secure Boot."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from installer import distros
from installer.errors import ConfigError, UnsupportedArch, UnsupportedDistro
from installer.hostroot import HostRoot

Flavour = Literal["open", "proprietary"]

OS_RELEASE_PATHS = ("/etc/os-release", "/usr/lib/os-release")

NVIDIA_VENDOR_ID = 0x10DE
# PCI base class 03 (display): 0x0300 VGA controller, 0x0302 3D controller (headless
# data-center GPUs). NVIDIA cards also expose audio (0x0403) and bridge functions.
_GPU_CLASS_PREFIXES = (0x0300, 0x0302)

SECURE_BOOT_EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

_KERNEL_RELEASE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}$")
_VERSION_LINE = re.compile(
    r"^NVRM version: NVIDIA UNIX (?:(?P<open>Open) Kernel Module for (?P<oarch>\S+)"
    r"|(?P<parch>\S+) Kernel Module)\s+(?P<version>\d+\.\d+(?:\.\d+)?)\s"
)
_DRIVER_VERSION = re.compile(r"^\d+\.\d+(?:\.\d+)?$")


@dataclass(frozen=True)
class Distro:
    """The host's distribution as os-release names it."""

    id: str
    version_id: str
    major: int
    family: str  # a family's name in installer.distros
    pretty_name: str
    codename: str = ""
    source: str = ""

    @property
    def package_manager(self) -> str:
        return distros.named(self.family).package_manager

    def __str__(self) -> str:
        return self.pretty_name or f"{self.id} {self.version_id}"


@dataclass(frozen=True)
class PciGpu:
    """One NVIDIA display/3D function found in sysfs (no driver needed)."""

    address: str
    device_id: int
    class_code: int
    subsystem_vendor: int | None = None
    subsystem_device: int | None = None
    bound_driver: str | None = None

    @property
    def pci_id(self) -> str:
        return f"10de:{self.device_id:04x}"


@dataclass(frozen=True)
class LoadedModule:
    """One line of /proc/modules."""

    name: str
    size: int
    refcount: int
    users: tuple[str, ...] = ()
    state: str = "Live"

    @property
    def in_use(self) -> bool:
        return self.refcount > 0


@dataclass(frozen=True)
class LoadedDriver:
    """The NVIDIA kernel module that is loaded now, from /proc/driver/nvidia/version."""

    version: str | None
    flavour: Flavour | None
    first_line: str


@dataclass(frozen=True)
class SecureBoot:
    """Secure Boot state: enabled is None when it cannot be told."""

    enabled: bool | None
    detail: str


@dataclass(frozen=True)
class Holder:
    """A process with an open file under a watched path prefix (e.g. /dev/nvidia0)."""

    pid: int
    command: str
    path: str


@dataclass(frozen=True)
class HostFacts:
    """Everything the planner needs to know about the host, gathered once."""

    distro: Distro
    kernel_release: str
    arch: str
    gpus: tuple[PciGpu, ...]
    modules: tuple[LoadedModule, ...]
    loaded_driver: LoadedDriver | None
    secure_boot: SecureBoot
    free_bytes: int

    @property
    def nouveau_loaded(self) -> bool:
        return self.module("nouveau") is not None

    def module(self, name: str) -> LoadedModule | None:
        """The loaded module `name` (dashes and underscores are the same), or None."""
        wanted = name.replace("-", "_")
        for module in self.modules:
            if module.name == wanted:
                return module
        return None


# --- distro ------------------------------------------------------------------------------


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=value lines with shell quoting, as os-release(5) defines them."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        try:
            parts = shlex.split(value)
        except ValueError:
            parts = [value.strip("\"'")]
        values[key.strip()] = " ".join(parts)
    return values


def detect_distro(root: HostRoot) -> Distro:
    """Read the host's os-release (reads /etc/os-release, then /usr/lib/os-release).

    Raises UnsupportedDistro when neither exists or the distro/version is not supported.
    """
    for host_path in OS_RELEASE_PATHS:
        text = root.read_text(host_path)
        if text is not None:
            return distro_from_os_release(text, str(root.local(host_path)))
    raise UnsupportedDistro(
        f"no os-release found under the host root {root.root} (looked for "
        f"{', '.join(str(root.local(p)) for p in OS_RELEASE_PATHS)}); the root may be wrong"
    )


def distro_from_os_release(text: str, source: str) -> Distro:
    """A supported Distro from os-release content; `source` names the file in errors."""
    values = parse_os_release(text)
    distro_id = values.get("ID", "").lower()
    version_id = values.get("VERSION_ID", "")
    found = f"ID={distro_id or '?'} VERSION_ID={version_id or '?'} (read from {source})"
    family = distros.for_os_release(distro_id)
    head = version_id.split(".", 1)[0]
    if family is None or not head.isdigit():
        raise UnsupportedDistro(f"unsupported distribution: {found}")
    if not family.supports(distro_id, version_id):
        raise UnsupportedDistro(f"unsupported distribution version: {found}")
    return Distro(
        id=distro_id,
        version_id=version_id,
        major=int(head),
        family=family.name,
        pretty_name=values.get("PRETTY_NAME", f"{distro_id} {version_id}"),
        codename=values.get("VERSION_CODENAME", ""),
        source=source,
    )


# --- kernel and arch ---------------------------------------------------------------------


def kernel_release(root: HostRoot, override: str | None = None) -> str:
    """The kernel to build for: `override`, else the running one.

    Reads /proc/sys/kernel/osrelease under the root (the host's, when /proc is mounted
    there), else uname (a container shares the host's kernel). Raises ConfigError when the
    value is not a plausible kernel release (it ends up in paths and argv).
    """
    if override is not None:
        release = override.strip()
        origin = "the kernel override"
    else:
        text = root.read_text("/proc/sys/kernel/osrelease")
        release = text.strip() if text else os.uname().release
        origin = "the running kernel"
    if not _KERNEL_RELEASE.fullmatch(release):
        raise ConfigError(f"{origin} {release!r} is not a valid kernel release")
    return release


_ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def normalise_arch(machine: str | None = None) -> str:
    """x86_64 or aarch64 from `machine` (default: uname); raises UnsupportedArch otherwise."""
    value = os.uname().machine if machine is None else machine
    arch = _ARCH_ALIASES.get(value.strip().lower())
    if arch is None:
        raise UnsupportedArch(f"unsupported machine architecture {value!r}")
    return arch


# --- PCI ---------------------------------------------------------------------------------


def _read_hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def nvidia_gpus(root: HostRoot) -> tuple[PciGpu, ...]:
    """NVIDIA display/3D functions from /sys/bus/pci/devices, sorted by address.

    Audio and bridge functions of NVIDIA cards are ignored. Reads sysfs only.
    """
    devices = root.local_resolved("/sys/bus/pci/devices")
    try:
        entries = sorted(os.listdir(devices))
    except OSError:
        return ()
    found: list[PciGpu] = []
    for name in entries:
        # The per-device links are relative (../../../devices/pci...), so plain local
        # path resolution stays inside the root; one HostRoot.resolve per file is not needed.
        device_dir = devices / name
        if _read_hex(device_dir / "vendor") != NVIDIA_VENDOR_ID:
            continue
        class_code = _read_hex(device_dir / "class")
        if class_code is None or (class_code >> 8) not in _GPU_CLASS_PREFIXES:
            continue
        device_id = _read_hex(device_dir / "device")
        if device_id is None:
            continue
        try:
            driver: str | None = os.path.basename(os.readlink(device_dir / "driver"))
        except OSError:
            driver = None
        found.append(
            PciGpu(
                address=name,
                device_id=device_id,
                class_code=class_code,
                subsystem_vendor=_read_hex(device_dir / "subsystem_vendor"),
                subsystem_device=_read_hex(device_dir / "subsystem_device"),
                bound_driver=driver,
            )
        )
    return tuple(found)


# --- modules and the loaded driver -------------------------------------------------------


def parse_proc_modules(text: str) -> tuple[LoadedModule, ...]:
    """Parse /proc/modules: `name size refcount users state address [taints]`."""
    modules: list[LoadedModule] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or not fields[1].isdigit():
            continue
        # refcount is "-" on kernels built without module unloading.
        refcount = int(fields[2]) if fields[2].isdigit() else 0
        users_field = fields[3] if len(fields) > 3 else "-"
        users = () if users_field == "-" else tuple(u for u in users_field.split(",") if u)
        state = fields[4] if len(fields) > 4 else "Live"
        modules.append(LoadedModule(fields[0], int(fields[1]), refcount, users, state))
    return tuple(modules)


def loaded_modules(root: HostRoot) -> tuple[LoadedModule, ...]:
    """The modules in the host's /proc/modules (empty when unreadable)."""
    return parse_proc_modules(root.read_text("/proc/modules", "") or "")


def parse_driver_version(text: str) -> tuple[str | None, Flavour | None]:
    """Version and flavour from the first line of /proc/driver/nvidia/version."""
    first = text.splitlines()[0] if text else ""
    match = _VERSION_LINE.match(first)
    if match is None:
        return None, None
    flavour: Flavour = "open" if match.group("open") else "proprietary"
    return match.group("version"), flavour


def loaded_driver(root: HostRoot) -> LoadedDriver | None:
    """The loaded NVIDIA driver, or None when /proc/driver/nvidia/version is absent."""
    text = root.read_text("/proc/driver/nvidia/version")
    if text is None:
        return None
    version, flavour = parse_driver_version(text)
    if version is None:
        # An unfamiliar first line: /sys/module/nvidia/version holds the version alone.
        plain = (root.read_text("/sys/module/nvidia/version") or "").strip()
        version = plain if _DRIVER_VERSION.fullmatch(plain) else None
    first = text.splitlines()[0] if text else ""
    return LoadedDriver(version=version, flavour=flavour, first_line=first)


# --- Secure Boot -------------------------------------------------------------------------


def secure_boot(root: HostRoot) -> SecureBoot:
    """Secure Boot from the SecureBoot efivar (4 attribute bytes, then the value byte)."""
    if not root.exists("/sys/firmware/efi"):
        return SecureBoot(False, "not EFI: no /sys/firmware/efi")
    efivars = root.local_resolved("/sys/firmware/efi/efivars")
    if not efivars.is_dir():
        return SecureBoot(None, "EFI, but efivarfs is not mounted at /sys/firmware/efi/efivars")
    try:
        data = root.local_resolved(SECURE_BOOT_EFIVAR).read_bytes()
    except FileNotFoundError:
        return SecureBoot(False, "EFI firmware without a SecureBoot variable")
    except OSError as exc:
        return SecureBoot(None, f"cannot read the SecureBoot variable: {exc.strerror or exc}")
    if not data:
        return SecureBoot(None, "the SecureBoot variable is empty")
    if data[-1] == 1:
        return SecureBoot(True, "enabled (SecureBoot efivar = 1)")
    return SecureBoot(False, f"disabled (SecureBoot efivar = {data[-1]})")


# --- free space and holders --------------------------------------------------------------


def free_bytes(path: Path) -> int:
    """Bytes available to this process on the filesystem holding local `path`.

    `path` need not exist yet: the nearest existing parent is measured.
    """
    current = Path(os.path.abspath(path))
    while not current.exists() and current != current.parent:
        current = current.parent
    stats = os.statvfs(current)
    return stats.f_bavail * stats.f_frsize


def holders_of(root: HostRoot, prefix: str = "/dev/nvidia") -> list[Holder]:
    """Processes with an open file whose path starts with `prefix`, by /proc/<pid>/fd.

    Processes that exit during the scan, or whose fds are not readable, are skipped.
    """
    proc = root.local_resolved("/proc")
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []
    seen: set[tuple[int, str]] = set()
    for pid in pids:
        fd_dir = proc / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target.startswith(prefix):
                seen.add((int(pid), target))
    holders = [Holder(pid, _command(proc / str(pid)), path) for pid, path in sorted(seen)]
    return holders


def _command(pid_dir: Path) -> str:
    try:
        comm = (pid_dir / "comm").read_text().strip()
    except OSError:
        comm = ""
    if comm:
        return comm
    try:
        argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return argv[0].decode(errors="replace") if argv and argv[0] else "?"


# --- everything at once ------------------------------------------------------------------


def gather(
    root: HostRoot,
    *,
    kernel_override: str | None = None,
    free_space_path: Path,
    machine: str | None = None,
) -> HostFacts:
    """Collect HostFacts by reading host files only (cheap: runs on the warm path).

    Raises UnsupportedDistro, UnsupportedArch, or ConfigError (a bad kernel override).
    """
    return HostFacts(
        distro=detect_distro(root),
        kernel_release=kernel_release(root, kernel_override),
        arch=normalise_arch(machine),
        gpus=nvidia_gpus(root),
        modules=loaded_modules(root),
        loaded_driver=loaded_driver(root),
        secure_boot=secure_boot(root),
        free_bytes=free_bytes(free_space_path),
    )
