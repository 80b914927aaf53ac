"""The argv we run of NVIDIA's .run and of its nvidia-installer: extract, version string,
build the modules only, install the user space only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple


def extract_argv(runfile: Path, target: Path, tmpdir: Path) -> list[str]:
    return ["sh", str(runfile), "--extract-only", "--target", str(target), "--tmpdir", str(tmpdir)]


def version_string_argv(runfile: Path) -> list[str]:
    return ["sh", str(runfile), "--version-string"]


def module_type_args(version: str, flavour: str) -> list[str]:
    """`-M` exists from R560 on; older installers spell it `-m=kernel-open|kernel`."""
    if int(version.split(".")[0]) >= 560:
        return [f"--kernel-module-type={flavour}"]
    return ["-m=kernel-open" if flavour == "open" else "-m=kernel"]


class BuildRequest(NamedTuple):
    extracted: Path
    version: str
    kernel: str
    flavour: str
    kernel_source: str
    kernel_output: str
    install_path: Path
    log_file: Path
    tmpdir: Path
    signing_key: Path | None = None
    signing_cert: Path | None = None
    jobs: int = 0


def build_modules_argv(req: BuildRequest) -> list[str]:
    """Build and install only the kernel modules into `install_path` (no load, no depmod)."""
    jobs = req.jobs or min(os.cpu_count() or 1, 32)
    argv = [
        str(req.extracted / "nvidia-installer"),
        "--silent",
        "--accept-license",
        "--kernel-modules-only",
        f"--kernel-name={req.kernel}",
        # Both paths, always: nvidia-installer takes a given source path as the output path
        # too, which is wrong for Debian's split headers (-common and -amd64).
        f"--kernel-source-path={req.kernel_source}",
        f"--kernel-output-path={req.kernel_output}",
        f"--kernel-install-path={req.install_path}",
        *module_type_args(req.version, req.flavour),
        "--no-drm",
        "--skip-module-load",
        "--skip-depmod",
        "--no-nouveau-check",
        "--no-rebuild-initramfs",
        # Whether this pass writes the GSP firmware is undocumented: never into the image's
        # own /lib/firmware (the firmware reaches the host from the extracted tree).
        f"--override-file-type-destination=FIRMWARE:{req.tmpdir}/firmware-of-module-pass",
        f"--concurrency-level={jobs}",
        f"--log-file-name={req.log_file}",
        f"--tmpdir={req.tmpdir}",
    ]
    if req.signing_key and req.signing_cert:
        argv += [
            f"--module-signing-secret-key={req.signing_key}",
            f"--module-signing-public-key={req.signing_cert}",
        ]
    return argv


def install_userspace_argv(
    extracted: Path, prefix: Path, log_file: Path, tmpdir: Path
) -> list[str]:
    """Install the user-space files under `prefix` only: every destination flag is given."""
    return [
        str(extracted / "nvidia-installer"),
        "--silent",
        "--accept-license",
        "--no-kernel-modules",
        f"--utility-prefix={prefix}",
        "--utility-libdir=lib64",
        f"--opengl-prefix={prefix}",
        "--opengl-libdir=lib64",
        f"--x-prefix={prefix}",
        f"--x-module-path={prefix}/lib64/xorg/modules",
        f"--x-library-path={prefix}/lib64",
        f"--documentation-prefix={prefix}",
        f"--override-file-type-destination=FIRMWARE:{prefix}/firmware",
        "--no-install-compat32-libs",
        "--no-install-libglvnd",
        "--no-rpms",
        "--no-backup",
        "--no-check-for-alternate-installs",
        "--no-distro-scripts",
        "--no-systemd",
        "--no-rebuild-initramfs",
        "--no-nouveau-check",
        f"--log-file-name={log_file}",
        f"--tmpdir={tmpdir}",
    ]
