"""Builders of fake host trees (os-release, sysfs PCI, /proc files) under a temp root."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from installer import state
from installer.host import PciGpu
from installer.hostroot import HostRoot
from installer.layout import READY_FILE

SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

# (ID, VERSION_ID, PRETTY_NAME, VERSION_CODENAME) as the real distros ship them.
OS_RELEASES: dict[str, tuple[str, str, str, str]] = {
    "ubuntu-20.04": ("ubuntu", "20.04", "Ubuntu 20.04.6 LTS", "focal"),
    "ubuntu-22.04": ("ubuntu", "22.04", "Ubuntu 22.04.4 LTS", "jammy"),
    "ubuntu-24.04": ("ubuntu", "24.04", "Ubuntu 24.04.1 LTS", "noble"),
    "debian-11": ("debian", "11", "Debian GNU/Linux 11 (bullseye)", "bullseye"),
    "debian-12": ("debian", "12", "Debian GNU/Linux 12 (bookworm)", "bookworm"),
    "debian-13": ("debian", "13", "Debian GNU/Linux 13 (trixie)", "trixie"),
    "rocky-8": ("rocky", "8.9", "Rocky Linux 8.9 (Green Obsidian)", ""),
    "rocky-9": ("rocky", "9.4", "Rocky Linux 9.4 (Blue Onyx)", ""),
    "rocky-10": ("rocky", "10.0", "Rocky Linux 10.0 (Red Quartz)", ""),
    "rhel-8": ("rhel", "8.10", "Red Hat Enterprise Linux 8.10 (Ootpa)", ""),
    "rhel-9": ("rhel", "9.4", "Red Hat Enterprise Linux 9.4 (Plow)", ""),
    "rhel-10": ("rhel", "10.0", "Red Hat Enterprise Linux 10.0 (Coughlan)", ""),
    "almalinux-8": ("almalinux", "8.10", "AlmaLinux 8.10 (Cerulean Leopard)", ""),
    "almalinux-9": ("almalinux", "9.4", "AlmaLinux 9.4 (Seafoam Ocelot)", ""),
    "almalinux-10": ("almalinux", "10.0", "AlmaLinux 10.0 (Purple Lion)", ""),
    "ubuntu-26.04": ("ubuntu", "26.04", "Ubuntu 26.04 LTS", "resolute"),
    "ol-8": ("ol", "8.10", "Oracle Linux Server 8.10", ""),
    "ol-9": ("ol", "9.6", "Oracle Linux Server 9.6", ""),
    "ol-10": ("ol", "10.0", "Oracle Linux Server 10.0", ""),
    "amzn-2023": ("amzn", "2023", "Amazon Linux 2023.9.20251117", ""),
}

# Common data-center device ids (NVIDIA's supported-gpus.json).
K80 = 0x102D
M60 = 0x13F2
P100 = 0x15F8
P4 = 0x1BB3
V100 = 0x1DB1
T4 = 0x1EB8
A100 = 0x20B0
A30 = 0x20B7
A10 = 0x2236
H100 = 0x2330
H200 = 0x2335
L4 = 0x27B8
L40S = 0x26B9
B200 = 0x2901
GB200 = 0x2941
# Grace-coupled (GH200, GB200, GB300) and the other Blackwell boards: open modules only.
GH200 = 0x2342
GH200_144G = 0x2348
B200_595 = 0x2909
B300 = 0x3182
GB300 = 0x31C2
GB300_595 = 0x31C3

CLASS_3D = 0x030200
CLASS_VGA = 0x030000
CLASS_AUDIO = 0x040300
CLASS_BRIDGE = 0x068000


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def host_root(root: Path) -> HostRoot:
    root.mkdir(parents=True, exist_ok=True)
    return HostRoot(root)


def write_os_release(
    root: Path,
    id: str,
    version_id: str | None,
    *,
    pretty_name: str | None = None,
    codename: str = "",
    id_like: str = "",
    path: str = "etc/os-release",
    extra: Mapping[str, str] | None = None,
) -> Path:
    """An os-release file with shell-quoted values, as the distros write it."""
    lines = [f'NAME="{id.capitalize()}"', f"ID={id}"]
    if version_id is not None:
        lines.append(f'VERSION_ID="{version_id}"')
    pretty = pretty_name or f"{id} {version_id or ''}".strip()
    lines.append(f'PRETTY_NAME="{pretty}"')
    if codename:
        lines.append(f"VERSION_CODENAME={codename}")
    if id_like:
        lines.append(f'ID_LIKE="{id_like}"')
    for key, value in (extra or {}).items():
        lines.append(f'{key}="{value}"')
    return _write(root / path, "\n".join(lines) + "\n")


def write_known_os_release(root: Path, key: str) -> Path:
    """One of OS_RELEASES (e.g. "rocky-9")."""
    distro_id, version_id, pretty, codename = OS_RELEASES[key]
    return write_os_release(root, distro_id, version_id, pretty_name=pretty, codename=codename)


def add_pci_device(
    root: Path,
    address: str,
    vendor: int = 0x10DE,
    device: int = T4,
    klass: int = CLASS_3D,
    *,
    subsystem_vendor: int | None = 0x10DE,
    subsystem_device: int | None = 0x12A2,
    driver: str | None = None,
) -> Path:
    """A PCI function the way sysfs lays it out: the device dir under /sys/devices, and a
    relative link to it from /sys/bus/pci/devices (as the kernel makes it)."""
    device_dir = root / "sys/devices/pci0000:00" / address
    device_dir.mkdir(parents=True, exist_ok=True)
    (device_dir / "vendor").write_text(f"{vendor:#06x}\n")
    (device_dir / "device").write_text(f"{device:#06x}\n")
    (device_dir / "class").write_text(f"{klass:#08x}\n")
    if subsystem_vendor is not None:
        (device_dir / "subsystem_vendor").write_text(f"{subsystem_vendor:#06x}\n")
    if subsystem_device is not None:
        (device_dir / "subsystem_device").write_text(f"{subsystem_device:#06x}\n")
    if driver is not None:
        driver_dir = root / "sys/bus/pci/drivers" / driver
        driver_dir.mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../../bus/pci/drivers/{driver}", device_dir / "driver")
    bus = root / "sys/bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(f"../../../devices/pci0000:00/{address}", bus / address)
    return device_dir


def add_gpus(root: Path, device_ids: Iterable[int], *, with_audio: bool = False) -> list[str]:
    """One GPU per id at consecutive bus addresses; returns the addresses."""
    addresses = []
    for index, device_id in enumerate(device_ids):
        address = f"0000:{0x10 + index:02x}:00.0"
        add_pci_device(root, address, device=device_id)
        if with_audio:
            add_pci_device(root, address[:-1] + "1", device=0x10F0, klass=CLASS_AUDIO)
        addresses.append(address)
    return addresses


def pci_gpus(*device_ids: int) -> list[PciGpu]:
    """The host facts' GPUs for these ids, at the addresses add_gpus gives them."""
    return [PciGpu(address=f"0000:{0x10 + i:02x}:00.0", device_id=d, class_code=0x030200)
            for i, d in enumerate(device_ids)]


def module_line(name: str, size: int = 16384, refcount: int = 0, users: Iterable[str] = ()) -> str:
    """One /proc/modules line in the kernel's format."""
    users_field = "".join(f"{u}," for u in users) or "-"
    return f"{name} {size} {refcount} {users_field} Live 0xffffffffc0a00000"


def write_proc_modules(root: Path, lines: Iterable[str] | str) -> Path:
    text = lines if isinstance(lines, str) else "".join(f"{line}\n" for line in lines)
    return _write(root / "proc/modules", text)


def driver_version_text(version: str, flavour: str = "proprietary", arch: str = "x86_64") -> str:
    """/proc/driver/nvidia/version content, in the real first-line formats."""
    if flavour == "open":
        first = (
            f"NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  {version}  Release Build"
            "  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:23:56 UTC 2024"
        )
    else:
        first = (
            f"NVRM version: NVIDIA UNIX {arch} Kernel Module  {version}  "
            "Tue Mar  5 22:23:56 UTC 2024"
        )
    return first + "\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"


def write_driver_version(
    root: Path, version: str, flavour: str = "proprietary", arch: str = "x86_64"
) -> Path:
    """A loaded driver: /proc/driver/nvidia/version and /sys/module/nvidia/version."""
    _write(root / "sys/module/nvidia/version", f"{version}\n")
    return _write(root / "proc/driver/nvidia/version", driver_version_text(version, flavour, arch))


def load_driver(
    root: Path, version: str, flavour: str = "proprietary", *, uvm: bool = True, holders: int = 0
) -> None:
    """A driver loaded as the kernel shows it: /proc/modules lists nvidia (with `holders`
    references) after nvidia_uvm unless `uvm` is off, and the driver's version files."""
    loaded = ["nvidia_uvm"] if uvm else []
    write_proc_modules(root, [*map(module_line, loaded), module_line("nvidia", refcount=holders)])
    write_driver_version(root, version, flavour)


def write_verified(root: Path, version: str, kernel: str) -> None:
    """What a passing verify leaves: nvidia_uvm and nvidia loaded, the driver's version, and
    the readiness file for `version` (open modules) built for `kernel`."""
    load_driver(root, version)
    path = HostRoot(root).local(READY_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(state.ready_text(version, "open", "/var/lib/nvidia", kernel))


def set_secure_boot(root: Path, on: bool | None) -> None:
    """EFI firmware with Secure Boot on/off; None = a BIOS (non-EFI) host."""
    efi = root / "sys/firmware/efi"
    if on is None:
        return
    # efivarfs content: 4 bytes of attributes (NV|BS|RT = 0x06), then the value.
    _write(efi / "efivars" / SECURE_BOOT_VAR, b"\x06\x00\x00\x00" + (b"\x01" if on else b"\x00"))


def write_osrelease_kernel(root: Path, release: str) -> Path:
    return _write(root / "proc/sys/kernel/osrelease", f"{release}\n")


def add_process(
    root: Path, pid: int, comm: str, fds: Mapping[int, str], cmdline: str | None = None
) -> Path:
    """/proc/<pid> with comm, cmdline and fd symlinks to `fds` targets (need not exist)."""
    proc = root / "proc" / str(pid)
    fd_dir = proc / "fd"
    fd_dir.mkdir(parents=True, exist_ok=True)
    (proc / "comm").write_text(f"{comm}\n" if comm else "")
    (proc / "cmdline").write_bytes(((cmdline or comm) + "\0").encode())
    for fd, target in fds.items():
        os.symlink(target, fd_dir / str(fd))
    return proc


def header_tree(tree: Path, kernel: str, gcc: int, page_kib: int | None) -> None:
    """The files the installer reads in a configured header tree: Makefile, the config (gcc
    version, arm64 page size), the generated version headers, kernel.h."""
    config = [f"CONFIG_GCC_VERSION={gcc * 10000 + 100}"]
    if page_kib is not None:
        shift = {4: 12, 16: 14, 64: 16}[page_kib]
        config += [f"CONFIG_ARM64_{page_kib}K_PAGES=y", f"CONFIG_ARM64_PAGE_SHIFT={shift}"]
    files = {
        "Makefile": "# the kernel's top Makefile\n",
        ".config": "\n".join(config) + "\n",
        "include/config/auto.conf": "\n".join(config) + "\n",
        "include/generated/uapi/linux/version.h": "#define LINUX_VERSION_CODE 0\n",
        "include/generated/utsrelease.h": f'#define UTS_RELEASE "{kernel}"\n',
        "include/linux/kernel.h": "/* kernel.h */\n",
    }
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)


def make_host(
    root: Path,
    *,
    distro: str = "ubuntu-22.04",
    kernel: str = "5.15.0-105-generic",
    gpus: Iterable[int] = (),
    modules: Iterable[str] = (),
    secure_boot: bool | None = False,
    headers: bool = False,
) -> HostRoot:
    """A plausible whole host: os-release, kernel, GPUs, /proc/modules, EFI state, and with
    `headers` the kernel's configured header tree (built by gcc 12) at Debian's path."""
    write_known_os_release(root, distro)
    write_osrelease_kernel(root, kernel)
    if headers:
        header_tree(root / f"usr/src/linux-headers-{kernel}", kernel, 12, None)
    add_gpus(root, gpus)
    write_proc_modules(root, list(modules))
    set_secure_boot(root, secure_boot)
    return host_root(root)


def root_env(root: Path, **env: str) -> dict[str, str]:
    """Settings for a host root under `root`: the container-side install dir points at a path
    that does not exist, so a real /usr/local/nvidia on the test machine is never used."""
    return {
        "ROOT_MOUNT_DIR": str(root),
        "NVIDIA_INSTALL_DIR_CONTAINER": str(root.parent / f"{root.name}-no-container-mount"),
        **env,
    }
