"""The kernel source and output paths, settled as NVIDIA's nvidia-installer does (kernel.c),
building with the package's own Makefile, and signing."""

from __future__ import annotations

import os
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
    install_path: str


@dataclass(frozen=True)
class KernelPaths:
    source: str
    output: str


def resolve_target(options: Options) -> KernelTarget:
    name = options.kernel_name or os.uname().release
    return KernelTarget(
        name=name,
        install_path=options.kernel_install_path or f"/lib/modules/{name}/kernel/drivers/video",
    )


def default_source_path(options: Options, name: str, log: Log) -> Optional[str]:
    """NVIDIA's default_kernel_source_path(): the flag and $SYSSRC are taken as given (checked
    later); the usual places only when they exist."""
    if options.kernel_source_path:
        log.detail(
            f"Using the kernel source path '{options.kernel_source_path}' as specified by the "
            "'--kernel-source-path' commandline option."
        )
        return options.kernel_source_path
    from_env = os.environ.get("SYSSRC")
    if from_env is not None:
        log.detail(
            f"Using the kernel source path '{from_env}', as specified by the SYSSRC "
            "environment variable."
        )
        return from_env
    modlib = f"/lib/modules/{name}"
    for candidate in (f"{modlib}/source", f"{modlib}/build/source", f"{modlib}/build",
                      f"/usr/src/linux-{name}", "/usr/src/linux"):
        if os.path.isdir(candidate):
            return candidate
    return None


def determine_output_path(options: Options, name: str, source: str, log: Log) -> str:
    """NVIDIA's determine_kernel_output_path(): the flag, else $SYSOUT, else `build` when the
    source path is /lib/modules/<k>/source (or .../build/source), else the source path itself."""
    given = options.kernel_output_path
    if given is not None:
        log.detail(
            f"Using the kernel output path '{given}' as specified by the "
            "'--kernel-output-path' commandline option."
        )
    elif os.environ.get("SYSOUT") is not None:
        given = os.environ["SYSOUT"]
        log.detail(
            f"Using the kernel output path '{given}', as specified by the SYSOUT "
            "environment variable."
        )
    if given is not None:
        if not os.path.isdir(given):
            raise InstallerError(f"The kernel output path '{given}' does not exist.")
        return given
    modlib = f"/lib/modules/{name}"
    if source.startswith((f"{modlib}/source", f"{modlib}/build/source")) and os.path.isdir(
        f"{modlib}/build"
    ):
        return f"{modlib}/build"
    return source


def determine_paths(options: Options, target: KernelTarget, log: Log) -> KernelPaths:
    """NVIDIA's determine_kernel_source_path(), with its checks and messages."""
    source = default_source_path(options, target.name, log)
    if source is None:
        raise InstallerError(
            "Unable to find the kernel source tree for the currently running "
            f"kernel.  {INSTALL_YOUR_KERNEL_SOURCE}"
        )
    if source in ("/usr", "/usr/"):
        raise InstallerError(
            f"The kernel source path '{source}' is invalid.  {INSTALL_YOUR_KERNEL_SOURCE}"
        )
    if not os.path.isdir(source):
        raise InstallerError(
            f"The kernel source path '{source}' does not exist.  {INSTALL_YOUR_KERNEL_SOURCE}"
        )
    kernel_h = f"{source}/include/linux/kernel.h"
    if not os.path.exists(kernel_h):
        raise InstallerError(
            f"The kernel header file '{kernel_h}' does not exist.  The most likely reason for "
            f"this is that the kernel source path '{source}' is incorrect.  "
            f"{INSTALL_YOUR_KERNEL_SOURCE}"
        )
    output = determine_output_path(options, target.name, source, log)
    version_h = f"{output}/include/linux/version.h"
    uapi_version_h = f"{output}/include/generated/uapi/linux/version.h"
    if not (os.path.exists(version_h) or os.path.exists(uapi_version_h)):
        raise InstallerError(
            f"Neither the '{version_h}' nor the '{uapi_version_h}' kernel header file exists. "
            "The most likely reason for this is that the kernel source files in "
            f"'{output}' have not been configured."
        )
    log.detail(f"Kernel source path: '{source}'\n")
    log.detail(f"Kernel output path: '{output}'\n")
    return KernelPaths(source, output)


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


# nvidia-installer's optional modules and the flags that leave them out, in its order.
OPTIONAL_MODULES = (
    ("nvidia-uvm", "no_unified_memory"),
    ("nvidia-drm", "no_drm"),
    ("nvidia-peermem", "no_peermem"),
)


def excluded_modules(options: Options, package_modules: list[str]) -> list[str]:
    """What NV_EXCLUDE_KERNEL_MODULES names: each left-out optional module the package has,
    put in front of the list as NVIDIA's remove_kernel_module_from_package() does."""
    excluded: list[str] = []
    for name, flag in OPTIONAL_MODULES:
        if getattr(options, flag) and name in package_modules:
            excluded.insert(0, name)
    return excluded


def make_command(options: Options, excluded: list[str], paths: KernelPaths) -> list[str]:
    """NVIDIA's run_make(): `make -k -jN NV_EXCLUDE_KERNEL_MODULES=... SYSSRC=... SYSOUT=...`
    in the package's kernel/ or kernel-open/ directory (a target, if any, is appended)."""
    jobs = options.concurrency_level or str(min(os.cpu_count() or 1, MAX_DEFAULT_JOBS))
    if not jobs.isdigit() or int(jobs) < 1:
        raise InstallerError(f"Invalid concurrency level '{jobs}'.")
    return [
        host.find_utility("make", package="make"),
        "-k",
        f"-j{jobs}",
        "NV_EXCLUDE_KERNEL_MODULES=" + " ".join(excluded),
        f"SYSSRC={paths.source}",
        f"SYSOUT={paths.output}",
    ]


def build_modules(
    package_dir: str,
    flavour: str,
    package_modules: list[str],
    options: Options,
    paths: KernelPaths,
    log: Log,
) -> list[str]:
    """Build in the package's own kernel/ or kernel-open/ directory (as nvidia-installer does
    for an install) with NVIDIA's Makefile; return the built .ko paths."""
    build_dir = os.path.join(package_dir, PACKAGE_DIR_BY_FLAVOUR[flavour])
    excluded = excluded_modules(options, package_modules)
    base = make_command(options, excluded, paths)
    log.detail("Cleaning kernel module build directory.")
    _run_make([*base, "clean"], build_dir, log)
    log.info(f"Building {flavour} kernel modules")
    status, output = _run_make(base, build_dir, log)
    if status != 0:
        log.detail(f"The command `{_shown(base, build_dir)}` failed with the following "
                   f"output:\n\n{output}")
        raise InstallerError(
            'An error occurred while performing the step: "Building kernel '
            f'modules". See {log.path} for details.'
        )
    log.detail(output)
    built = []
    for name in package_modules:
        if name in excluded:
            continue
        path = os.path.join(build_dir, f"{name}.ko")
        if not os.path.isfile(path):
            raise InstallerError(
                f"The kernel module build did not produce {name}.ko. See {log.path} for details."
            )
        built.append(path)
    log.detail("Kernel module compilation complete.")
    return built


def _shown(argv: list[str], cwd: str) -> str:
    """The command as nvidia-installer's log shows it (values in double quotes)."""
    words = []
    for word in argv:
        name, eq, value = word.partition("=")
        words.append(f'{name}="{value}"' if eq and name.isupper() else word)
    return f"cd {cwd}; " + " ".join(words)


def _run_make(argv: list[str], cwd: str, log: Log) -> tuple[int, str]:
    log.detail(f"executing: '{_shown(argv, cwd)}'...")
    return host.run(argv, cwd=cwd)


def sign_modules(modules: list[str], options: Options, paths: KernelPaths, log: Log) -> None:
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
    sign_file = _find_sign_file(paths)
    for module in modules:
        status, output = host.run([sign_file, options.module_signing_hash, secret, public, module])
        log.detail(output)
        if status != 0:
            raise InstallerError(
                f"Failed to sign the kernel module '{os.path.basename(module)}'. "
                f"See {log.path} for details."
            )
    log.info(f"Signed {len(modules)} kernel modules with {options.module_signing_hash}.")


def _find_sign_file(paths: KernelPaths) -> str:
    """scripts/sign-file of the output tree, else of the source tree (NVIDIA's order)."""
    for tree in (paths.output, paths.source):
        candidate = os.path.join(tree, "scripts", "sign-file")
        if os.access(candidate, os.X_OK):
            return candidate
    raise InstallerError(
        "nvidia-installer cannot sign the kernel modules without the `sign-file` utility: "
        f"it is in neither '{paths.output}/scripts' nor '{paths.source}/scripts'."
    )
