"""Facts about the host and the system tools the real installer runs (found like it does)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Optional

from .errors import InstallerError

# The real tool looks in PATH first, then the usual sbin directories.
UTILITY_SEARCH_PATH = (
    "/usr/local/sbin",
    "/usr/sbin",
    "/sbin",
    "/usr/local/bin",
    "/usr/bin",
    "/bin",
)
PCI_DEVICES = "/sys/bus/pci/devices"


def find_utility(name: str, package: str = "kmod") -> str:
    search = os.pathsep.join([os.environ.get("PATH", ""), *UTILITY_SEARCH_PATH])
    found = shutil.which(name, path=search)
    if not found:
        raise InstallerError(
            f"Unable to find the system utility `{name}`; please make sure you "
            f"have the package '{package}' installed."
        )
    return found


def run(argv: list[str], cwd: Optional[str] = None) -> tuple[int, str]:
    """Run a command; returns its exit status and combined stdout+stderr."""
    completed = subprocess.run(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    return completed.returncode, completed.stdout


def default_libdir() -> str:
    """Debian-style multiarch first, then lib64, then lib, as nvidia-installer decides."""
    if os.path.isdir("/usr/lib/x86_64-linux-gnu"):
        return "lib/x86_64-linux-gnu"
    if os.path.isdir("/usr/lib64"):
        return "lib64"
    return "lib"


def parse_loaded_modules(text: str) -> set[str]:
    """Module names from /proc/modules text ("name size refcount users state address")."""
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def loaded_modules(proc_modules: str = "/proc/modules") -> set[str]:
    try:
        with open(proc_modules) as handle:
            return parse_loaded_modules(handle.read())
    except OSError:
        return set()


def nvidia_gpu_device_ids(devices_dir: str = PCI_DEVICES) -> list[int]:
    """Device ids of NVIDIA display controllers (VGA 0x0300 or 3D 0x0302) in sysfs."""
    found = []
    try:
        addresses = sorted(os.listdir(devices_dir))
    except OSError:
        return []
    for address in addresses:
        device_dir = os.path.join(devices_dir, address)
        vendor = _read(os.path.join(device_dir, "vendor"))
        pci_class = _read(os.path.join(device_dir, "class"))
        if vendor == "0x10de" and pci_class.startswith(("0x0300", "0x0302")):
            found.append(int(_read(os.path.join(device_dir, "device")) or "0", 16))
    return found


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip().lower()
    except OSError:
        return ""
