"""Where each user-space file type lands, and putting the files there."""

from __future__ import annotations

import os
import shutil

from . import host
from .errors import InstallerError
from .log import Log
from .manifest import Manifest
from .options import Options


def destinations(options: Options, version: str) -> dict[str, str]:
    utility_libdir = options.utility_libdir or host.default_libdir()
    opengl_libdir = options.opengl_libdir or host.default_libdir()
    dirs = {
        "UTILITY_BINARY": os.path.join(options.utility_prefix, "bin"),
        "UTILITY_LIB": os.path.join(options.utility_prefix, utility_libdir),
        "CUDA_LIB": os.path.join(options.opengl_prefix, opengl_libdir),
        "FIRMWARE": f"/lib/firmware/nvidia/{version}",
        "DOCUMENTATION": os.path.join(options.documentation_prefix, "share/doc/NVIDIA_GLX-1.0"),
    }
    for override in options.override_file_type_destination:
        file_type, _, directory = override.partition(":")
        if file_type not in dirs or not directory:
            raise InstallerError(f"Invalid file type destination override '{override}'.")
        dirs[file_type] = directory
    return dirs


def make_dirs(path: str) -> None:
    """mkdir -p with 0755 whatever the umask (the .run extracts under umask 077)."""
    missing = []
    path = os.path.normpath(path)
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        os.mkdir(directory)
        os.chmod(directory, 0o755)


def install_files(
    package_dir: str, manifest: Manifest, options: Options, log: Log, firmware: bool = False
) -> list[str]:
    """The user-space files, or with `firmware` only the GSP firmware (the kernel-module pass
    writes it: a `--no-kernel-modules` install leaves it out)."""
    dirs = destinations(options, manifest.version)
    installed = []
    for entry in manifest.entries:
        if (entry.file_type == "FIRMWARE") != firmware:
            continue
        if options.no_nvidia_modprobe and os.path.basename(entry.path) == "nvidia-modprobe":
            continue
        directory = os.path.join(dirs[entry.file_type], entry.subdir)
        destination = os.path.join(directory, os.path.basename(entry.path))
        make_dirs(directory)
        partial = destination + ".nvidia-installer-tmp"
        shutil.copyfile(os.path.join(package_dir, entry.path), partial)
        os.chmod(partial, entry.mode)
        os.replace(partial, destination)
        installed.append(destination)
    log.info(f"Installed {len(installed)} {'firmware' if firmware else 'user-space'} files.")
    return installed


def run_ldconfig(log: Log) -> None:
    status, output = host.run([host.find_utility("ldconfig")])
    log.detail(output)
    if status != 0:
        log.warning(f"Unable to update the dynamic linker cache with `ldconfig`: {output.strip()}")
