"""The install, uninstall and query flows, in the order the real nvidia-installer runs them."""

from __future__ import annotations

import os
import sys

from . import gpus, host, kernel, modules, record, userspace
from .errors import InstallerError
from .log import Log
from .manifest import Manifest, load
from .options import SPECS, Options, parse


def run(argv: list[str], package_dir: str) -> int:
    # makeself runs the installer under umask 077; installed files must still be world-readable.
    os.umask(0o022)
    manifest = load(package_dir)
    try:
        options = parse(argv)
    except InstallerError as error:
        print(
            f"ERROR: {error}\n\nPlease run `nvidia-installer --help` for usage information.",
            file=sys.stderr,
        )
        return 1
    if options.help or options.advanced_options:
        print_help(manifest)
        return 0
    if options.version:
        print(
            f"\nnvidia-installer:  version {manifest.version}\n"
            "  The NVIDIA Software Installer for Unix/Linux (test kit stand-in).\n"
        )
        return 0
    log = Log(options.log_file_name, options.silent)
    log.header(manifest.version, argv)
    try:
        return dispatch(options, manifest, package_dir, log)
    except InstallerError as error:
        log.error(str(error))
        return 1
    finally:
        log.close()


def dispatch(options: Options, manifest: Manifest, package_dir: str, log: Log) -> int:
    if options.print_recommended_kernel_module_type:
        print(recommended_flavour(manifest, package_dir))
        return 0
    if options.uninstall:
        return uninstall(options, log)
    if options.sanity:
        return sanity(options, log)
    return install(options, manifest, package_dir, log)


def recommended_flavour(manifest: Manifest, package_dir: str) -> str:
    chips = gpus.load_chips(os.path.join(package_dir, "supported-gpus/supported-gpus.json"))
    return gpus.recommend(manifest.version, host.nvidia_gpu_device_ids(), chips)


def install(options: Options, manifest: Manifest, package_dir: str, log: Log) -> int:
    if options.kernel_modules_only and options.no_kernel_modules:
        raise InstallerError("--kernel-modules-only and --no-kernel-modules cannot be combined.")
    with_modules = not options.no_kernel_modules
    with_userspace = not options.kernel_modules_only
    target = kernel.resolve_target(options)
    if with_modules and not options.no_nouveau_check:
        modules.check_nouveau(modules.read_proc_modules())
    warn_about_legacy_gpus(package_dir, log)
    previous = record.load(options)
    kept: list[str] = []
    if previous and with_modules and with_userspace:
        log.info(
            f"There appears to already be a driver installed on your system (version: "
            f"{previous.version}).  As part of installing this driver (version: "
            f"{manifest.version}), the existing driver will be uninstalled."
        )
        record.remove_files(previous)
    elif previous:
        kept = previous.files
    installed: list[str] = []
    if with_modules:
        installed += install_kernel_modules(options, manifest, package_dir, target, log)
        installed += userspace.install_files(package_dir, manifest, options, log, firmware=True)
    if with_userspace:
        installed += userspace.install_files(package_dir, manifest, options, log)
        userspace.run_ldconfig(log)
    record.save(
        options, record.Record(manifest.version, target.name, sorted(set(kept) | set(installed)))
    )
    if with_modules and not options.skip_module_load:
        modules.load_nvidia(log)
    log.info(
        f"Installation of the {manifest.description} (version: {manifest.version}) is now complete."
    )
    return 0


def install_kernel_modules(
    options: Options, manifest: Manifest, package_dir: str, target: kernel.KernelTarget, log: Log
) -> list[str]:
    flavour = kernel.resolve_flavour(options, manifest.version)
    paths = kernel.determine_paths(options, target, log)
    if options.tmpdir and not os.path.isdir(options.tmpdir):
        raise InstallerError(f"The temporary directory '{options.tmpdir}' does not exist.")
    built = kernel.build_modules(
        package_dir, flavour, manifest.kernel_modules, options, paths, log
    )
    kernel.sign_modules(built, options, paths, log)
    installed = modules.install_modules(built, target, log)
    if not options.skip_depmod:
        modules.run_depmod(target.name, log)
    return installed


def warn_about_legacy_gpus(package_dir: str, log: Log) -> None:
    chips = gpus.load_chips(os.path.join(package_dir, "supported-gpus/supported-gpus.json"))
    for description in gpus.legacy_gpus(host.nvidia_gpu_device_ids(), chips):
        log.warning(
            f"The NVIDIA {description} GPU installed in this system is not supported by "
            "this driver release."
        )


def uninstall(options: Options, log: Log) -> int:
    previous = record.load(options)
    if previous is None:
        raise InstallerError(
            "No NVIDIA driver installed by nvidia-installer was found (no "
            f"record at '{record.record_path(options)}')."
        )
    removed = record.remove_files(previous)
    record.delete(options)
    if any(path.endswith(".ko") for path in removed) and not options.skip_depmod:
        modules.run_depmod(previous.kernel_name, log)
    userspace.run_ldconfig(log)
    log.info(
        "Uninstallation of existing driver: NVIDIA Accelerated Graphics Driver for "
        f"Linux-x86_64 ({previous.version}) is complete."
    )
    return 0


def sanity(options: Options, log: Log) -> int:
    previous = record.load(options)
    if previous is None:
        raise InstallerError("Unable to find any installed NVIDIA driver.")
    missing = [path for path in previous.files if not os.path.exists(path)]
    if missing:
        raise InstallerError("The following installed files are missing: " + ", ".join(missing))
    log.info(f"'Sanity' check of the NVIDIA driver version {previous.version} passed.")
    return 0


def print_help(manifest: Manifest) -> None:
    print(f"nvidia-installer [options]  ({manifest.description}, version {manifest.version})\n")
    for spec in SPECS:
        names = ([f"-{spec.short}"] if spec.short else []) + [f"--{spec.long}"]
        names += [f"--{alias}" for alias in spec.aliases]
        suffix = "=VALUE" if spec.takes_value else ""
        print("  " + ", ".join(names) + suffix)
