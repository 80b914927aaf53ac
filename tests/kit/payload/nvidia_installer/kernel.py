"""Building the kernel modules with kbuild against a kernel source tree, and signing them."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from typing import Optional

from . import host
from .errors import InstallerError
from .gpus import OPEN, PROPRIETARY, default_flavour
from .log import Log
from .options import Options

INSTALL_YOUR_KERNEL_SOURCE = (
    "Please make sure you have installed the kernel source files for your kernel and that they "
    "are properly configured; on Red Hat Linux systems, for example, be sure you have the "
    "'kernel-source' or 'kernel-devel' RPM installed.  If you know the correct kernel source "
    "files are installed, you may specify the kernel source path with the '--kernel-source-path' "
    "command line option."
)
MAX_DEFAULT_JOBS = 32
PACKAGE_DIR_BY_FLAVOUR = {OPEN: "kernel-open", PROPRIETARY: "kernel"}
FLAVOUR_BY_OLD_BUILD_DIRECTORY = {"kernel-open": OPEN, "kernel": PROPRIETARY}


@dataclass(frozen=True)
class KernelTarget:
    name: str
    source_path: str
    install_path: str


def resolve_target(options: Options) -> KernelTarget:
    name = options.kernel_name or os.uname().release
    return KernelTarget(
        name=name,
        source_path=options.kernel_source_path or f"/lib/modules/{name}/build",
        install_path=options.kernel_install_path or f"/lib/modules/{name}/kernel/drivers/video",
    )


def resolve_flavour(options: Options, version: str) -> str:
    if options.kernel_module_type:
        if options.kernel_module_type not in (OPEN, PROPRIETARY):
            raise InstallerError(
                f"Invalid kernel module type '{options.kernel_module_type}'; "
                "valid types are 'open' and 'proprietary'."
            )
        return options.kernel_module_type
    if options.kernel_module_build_directory:
        flavour = FLAVOUR_BY_OLD_BUILD_DIRECTORY.get(options.kernel_module_build_directory)
        if flavour is None:
            raise InstallerError(
                f"Invalid kernel module build directory '{options.kernel_module_build_directory}'."
            )
        return flavour
    return default_flavour(version)


def source_tree_release(source_path: str) -> Optional[str]:
    """The kernel release the tree was configured for.

    Like NVIDIA's conftest (get_uname) this reads UTS_RELEASE from utsrelease.h: Debian's
    include/config/kernel.release holds the upstream version (6.1.192), not `uname -r`.
    """
    for header in ("include/generated/utsrelease.h", "include/linux/utsrelease.h"):
        try:
            with open(os.path.join(source_path, header)) as handle:
                match = re.search(r'#define\s+UTS_RELEASE\s+"([^"]+)"', handle.read())
        except OSError:
            continue
        if match:
            return match.group(1)
    try:
        with open(os.path.join(source_path, "include/config/kernel.release")) as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def check_source_tree(options: Options, target: KernelTarget) -> None:
    if not os.path.isdir(target.source_path):
        if options.kernel_source_path:
            raise InstallerError(
                f"The kernel source path '{target.source_path}' does not exist.  "
                f"{INSTALL_YOUR_KERNEL_SOURCE}"
            )
        raise InstallerError(
            "Unable to find the kernel source tree for the currently running "
            f"kernel.  {INSTALL_YOUR_KERNEL_SOURCE}"
        )
    if options.kernel_output_path and not os.path.isdir(options.kernel_output_path):
        raise InstallerError(
            f"The kernel output path '{options.kernel_output_path}' does not exist."
        )
    release = source_tree_release(target.source_path)
    if release is None:
        raise InstallerError(
            "Unable to determine the version of the kernel sources located in "
            f"'{target.source_path}'.  {INSTALL_YOUR_KERNEL_SOURCE}"
        )
    if release != target.name:
        raise InstallerError(
            f"The kernel source tree at '{target.source_path}' is for kernel "
            f"'{release}', which does not match the target kernel "
            f"'{target.name}'.  {INSTALL_YOUR_KERNEL_SOURCE}"
        )


def expected_modules(options: Options) -> list[str]:
    names = ["nvidia", "nvidia-modeset"]
    if not options.no_unified_memory:
        names.append("nvidia-uvm")
    if not options.no_drm:
        names.append("nvidia-drm")
    return names


def make_command(
    options: Options, version: str, flavour: str, source: str, build_dir: str
) -> list[str]:
    jobs = options.concurrency_level or str(min(os.cpu_count() or 1, MAX_DEFAULT_JOBS))
    if not jobs.isdigit() or int(jobs) < 1:
        raise InstallerError(f"Invalid concurrency level '{jobs}'.")
    argv = [
        "make",
        "-C",
        source,
        f"M={build_dir}",
        f"NV_VERSION={version}",
        f"NV_FLAVOUR={flavour}",
    ]
    if options.no_unified_memory:
        argv.append("NV_BUILD_UVM=0")
    if options.no_drm:
        argv.append("NV_BUILD_DRM=0")
    return [*argv, f"-j{jobs}", "modules"]


def build_modules(
    package_dir: str,
    build_root: str,
    version: str,
    flavour: str,
    options: Options,
    target: KernelTarget,
    log: Log,
) -> list[str]:
    """Copy the flavour's sources into build_root, run kbuild, return the built .ko paths."""
    build_dir = os.path.join(build_root, PACKAGE_DIR_BY_FLAVOUR[flavour])
    shutil.copytree(os.path.join(package_dir, PACKAGE_DIR_BY_FLAVOUR[flavour]), build_dir)
    argv = make_command(options, version, flavour, target.source_path, build_dir)
    log.info(f"Building {flavour} kernel modules for kernel {target.name}.")
    log.detail("Kernel module compilation command: " + " ".join(argv))
    status, output = host.run(argv, cwd=build_dir)
    log.detail(output)
    if status != 0:
        raise InstallerError(
            'An error occurred while performing the step: "Building kernel '
            f'modules". See {log.path} for details.'
        )
    built = []
    for name in expected_modules(options):
        path = os.path.join(build_dir, f"{name}.ko")
        if not os.path.isfile(path):
            raise InstallerError(
                f"The kernel module build did not produce {name}.ko. See {log.path} for details."
            )
        built.append(path)
    return built


def sign_modules(modules: list[str], options: Options, target: KernelTarget, log: Log) -> None:
    secret, public = options.module_signing_secret_key, options.module_signing_public_key
    if not secret and not public:
        return
    if not (secret and public):
        raise InstallerError(
            "Module signing needs both --module-signing-secret-key and --module-signing-public-key."
        )
    for key in (secret, public):
        if not os.path.isfile(key):
            raise InstallerError(f"The module signing key '{key}' does not exist.")
    sign_file = _find_sign_file(options, target)
    for module in modules:
        status, output = host.run([sign_file, options.module_signing_hash, secret, public, module])
        log.detail(output)
        if status != 0:
            raise InstallerError(
                f"Failed to sign the kernel module '{os.path.basename(module)}'. "
                f"See {log.path} for details."
            )
    log.info(f"Signed {len(modules)} kernel modules with {options.module_signing_hash}.")


def _find_sign_file(options: Options, target: KernelTarget) -> str:
    trees = [target.source_path]
    if options.kernel_output_path:
        trees.append(options.kernel_output_path)
    for tree in trees:
        candidate = os.path.join(tree, "scripts", "sign-file")
        if os.access(candidate, os.X_OK):
            return candidate
    raise InstallerError(
        "Unable to find the module signing utility 'scripts/sign-file' in the "
        f"kernel source tree '{target.source_path}'."
    )
