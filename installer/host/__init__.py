"""Read-only facts about the host: distro, kernel, arch, NVIDIA GPUs, modules, Secure Boot, the
NVLink fabric's hardware, gathered once for the planner. distro.py, pci.py, fabric.py and
loaded.py read their parts; this door exports them all."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from installer.errors import ConfigError, UnsupportedArch
from installer.host.distro import (
    OS_RELEASE_PATHS,
    Distro,
    detect_distro,
    distro_from_os_release,
    parse_os_release,
)
from installer.host.fabric import (
    FabricHardware,
    LpfPort,
    PciSwitch,
    fabric_hardware,
    lpf_ports,
    pci_switches,
)
from installer.host.loaded import (
    Flavour,
    Holder,
    LoadedDriver,
    LoadedModule,
    holders_of,
    loaded_driver,
    loaded_modules,
    parse_driver_version,
    parse_proc_modules,
)
from installer.host.pci import (
    MELLANOX_VENDOR_ID,
    NVIDIA_VENDOR_ID,
    PciGpu,
    nvidia_gpus,
    pci_id,
    vendor_functions,
)
from installer.hostroot import HostRoot

__all__ = [
    "MELLANOX_VENDOR_ID",
    "NVIDIA_VENDOR_ID",
    "OS_RELEASE_PATHS",
    "SECURE_BOOT_EFIVAR",
    "Distro",
    "FabricHardware",
    "Flavour",
    "Holder",
    "HostFacts",
    "LoadedDriver",
    "LoadedModule",
    "LpfPort",
    "PciGpu",
    "PciSwitch",
    "SecureBoot",
    "detect_distro",
    "distro_from_os_release",
    "fabric_hardware",
    "free_bytes",
    "gather",
    "holders_of",
    "host_machine",
    "kernel_release",
    "kmsg",
    "loaded_driver",
    "loaded_modules",
    "lpf_ports",
    "normalise_arch",
    "nvidia_gpus",
    "pagesize",
    "parse_driver_version",
    "parse_os_release",
    "parse_proc_modules",
    "pci_id",
    "pci_switches",
    "readiness",
    "secure_boot",
    "vendor_functions",
]

SECURE_BOOT_EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

_KERNEL_RELEASE = r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}$"


class SecureBoot(NamedTuple):
    """Secure Boot state: enabled is None when it cannot be told."""

    enabled: bool | None
    detail: str


class HostFacts(NamedTuple):
    """Everything the planner needs to know about the host, gathered once."""

    distro: Distro
    kernel_release: str
    arch: str
    gpus: tuple[PciGpu, ...]
    modules: tuple[LoadedModule, ...]
    loaded_driver: LoadedDriver | None
    secure_boot: SecureBoot
    free_bytes: int
    # NVSwitch functions and NVLink5 LPF ports: whether Fabric Manager and NVLSM apply.
    fabric: FabricHardware

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
    if not re.fullmatch(_KERNEL_RELEASE, release):
        raise ConfigError(f"{origin} {release!r} is not a valid kernel release")
    return release


_ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def host_machine(root: HostRoot) -> str | None:
    """The host kernel's machine (kernel.arch sysctl) read under the root, as the kernel release
    is; None where /proc is not there (uname then: a container shares the host's kernel)."""
    text = root.read_text("/proc/sys/kernel/arch")
    return text.strip() if text and text.strip() else None


def normalise_arch(machine: str | None = None) -> str:
    """x86_64 or aarch64 from `machine` (default: uname); raises UnsupportedArch otherwise."""
    value = os.uname().machine if machine is None else machine
    arch = _ARCH_ALIASES.get(value.strip().lower())
    if arch is None:
        raise UnsupportedArch(f"unsupported machine architecture {value!r}")
    return arch


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


# --- free space --------------------------------------------------------------------------


def free_bytes(path: Path) -> int:
    """Bytes available to this process on the filesystem holding local `path`.

    `path` need not exist yet: the nearest existing parent is measured.
    """
    current = Path(os.path.abspath(path))
    while not current.exists() and current != current.parent:
        current = current.parent
    stats = os.statvfs(current)
    return stats.f_bavail * stats.f_frsize


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
        arch=normalise_arch(machine if machine is not None else host_machine(root)),
        gpus=nvidia_gpus(root),
        modules=loaded_modules(root),
        loaded_driver=loaded_driver(root),
        secure_boot=secure_boot(root),
        free_bytes=free_bytes(free_space_path),
        fabric=fabric_hardware(root),
    )
