"""Installing built kernel modules, depmod, nouveau detection and the post-install module load."""

from __future__ import annotations

import os
import shutil

from . import host
from .errors import InstallerError
from .kernel import KernelTarget
from .log import Log

NOUVEAU_MESSAGE = (
    "The Nouveau kernel driver is currently in use by your system.  This driver is incompatible "
    "with the NVIDIA driver, and must be disabled before proceeding.  Please consult the NVIDIA "
    "driver README and your Linux distribution's documentation for details on how to correctly "
    "disable the Nouveau kernel driver."
)


def check_nouveau(modules_text: str) -> None:
    """Raise like the real installer when nouveau appears in /proc/modules text."""
    if "nouveau" in host.parse_loaded_modules(modules_text):
        raise InstallerError(NOUVEAU_MESSAGE)


def read_proc_modules() -> str:
    try:
        with open("/proc/modules") as handle:
            return handle.read()
    except OSError:
        return ""


def install_modules(built: list[str], target: KernelTarget, log: Log) -> list[str]:
    os.makedirs(target.install_path, exist_ok=True)
    installed = []
    for module in built:
        destination = os.path.join(target.install_path, os.path.basename(module))
        shutil.copyfile(module, destination)
        os.chmod(destination, 0o644)
        installed.append(destination)
    log.info(f"Installed {len(installed)} kernel modules into {target.install_path}.")
    return installed


def run_depmod(kernel_name: str, log: Log) -> None:
    argv = [host.find_utility("depmod"), "-a", kernel_name]
    status, output = host.run(argv)
    log.detail(output)
    if status != 0:
        raise InstallerError(f"Failed to run `{' '.join(argv)}`: {output.strip()}")


def load_nvidia(log: Log) -> None:
    """modprobe nvidia when an NVIDIA GPU is present; warn and skip otherwise."""
    if not host.nvidia_gpu_device_ids():
        log.warning(
            "No NVIDIA GPU was detected in this system; the NVIDIA kernel module was "
            "installed but not loaded."
        )
        return
    status, output = host.run([host.find_utility("modprobe"), "nvidia"])
    log.detail(output)
    if status != 0:
        raise InstallerError(
            "Unable to load the kernel module 'nvidia.ko'.  This happens most "
            "frequently when this kernel module was built against the wrong or "
            "improperly configured kernel sources, with a version of gcc that "
            "differs from the one used to build the target kernel, or if another "
            "driver, such as nouveau, is present and prevents the NVIDIA kernel "
            f"module from obtaining ownership of the NVIDIA GPU(s).  {output.strip()}"
        )
