"""NVLSM on dnf hosts (HGX B200/B300): NVIDIA's `nvlsm` package from the host's NVIDIA repo, which
dnf checks against the repo's signing key as it does the driver's packages; its daemon, plugin
and config files go into versions/<ver>/ where the runfile source puts the redist archive's, so
`installer fabricmanager` runs it the same way on every source."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path, PurePosixPath

from installer.components import nvlsm_archive
from installer.dirs import scratch
from installer.errors import CommandFailed, NvlsmPackageMismatch
from installer.plan import Context, Step
from installer.sources.dnf import commands, fabricmanager, host_state
from installer.sources.dnf.errors import (
    NO_MATCH,
    REPO_DOWN,
    nvlsm_unavailable,
    repo_down,
    transaction_failed,
)
from installer.sources.dnf.plan import base_argv

log = logging.getLogger(__name__)

PACKAGE = commands.NVLSM_PACKAGE
# Where NVIDIA's nvlsm rpm (and deb) puts its files: the daemon and its gRPC plugin under
# /opt/nvidia/nvlsm (the daemon's RPATH), the config files nvlsm.conf names under
# /usr/share/nvidia/nvlsm (Fabric Manager's service runs
# `/opt/nvidia/nvlsm/sbin/nvlsm -F /usr/share/nvidia/nvlsm/nvlsm.conf`).
PREFIX = PurePosixPath("/opt/nvidia/nvlsm")
SHARE_DIR = PurePosixPath("/usr/share/nvidia/nvlsm")


def install_argv(base: list[str], pin: str | None) -> list[str]:
    return [*base, "install", commands.nvlsm_spec(pin)]


def package_tree(files: list[PurePosixPath], local: dict[PurePosixPath, Path], tree: Path
                 ) -> list[str]:
    """The package's files (host path -> file here) copied into `tree` in the redist archive's
    layout (sbin/nvlsm, lib/, share/nvidia/nvlsm/); returns the host paths taken."""

    def dest_of(path: PurePosixPath) -> Path | None:
        if path == PREFIX / "sbin" / "nvlsm":
            return tree / "sbin" / "nvlsm"
        if path.parent == PREFIX / "lib" and ".so" in path.name:
            return tree / "lib" / path.name
        if path.parent == SHARE_DIR and path.suffix == ".conf":
            return tree / "share" / "nvidia" / "nvlsm" / path.name
        return None

    return fabricmanager.copy_files(files, local, dest_of)


def install_step(ctx: Context) -> Step:
    """The nvlsm package's files into versions/<ver>/ with a marker naming its version and its
    daemon's SHA-256. The driver's transaction installs the package (install_argv in
    commands.py); a host already on the driver without it (or without the pinned version) gets
    it here with `dnf install`. Raises NvlsmPackageUnavailable when the repo has no such
    package, NvlsmPackageMismatch when the host's is not the pin or lacks NVIDIA's files
    (nothing copied then)."""
    layout, pin = ctx.layout, ctx.config.nvlsm_version
    spec = commands.nvlsm_spec(pin)

    def host_version() -> str | None:
        return host_state.installed_versions(ctx.root, ctx.runner, [PACKAGE]).get(PACKAGE)

    def satisfied() -> bool:
        found = nvlsm_archive.installed(layout, ctx.target.version)
        return found is not None and (pin is None or found == pin)

    def apply() -> None:
        driver = ctx.target.version  # what the driver's transaction installed
        found = host_version()
        if found is None or (pin is not None and found != pin):
            _dnf_install(ctx, pin)
            found = host_version()
        if found is None or (pin is not None and found != pin):
            raise NvlsmPackageMismatch(
                f"after `dnf install {spec}` the host's {PACKAGE} is {found or 'not installed'}"
                + (f", not NVIDIA_NVLSM_VERSION {pin}" if pin else ""))
        listed = ctx.runner.run(commands.rpm_files_argv(ctx.root, [PACKAGE]), timeout=120).output
        files = [PurePosixPath(line.strip()) for line in listed.splitlines()
                 if line.startswith("/")]
        with scratch(layout.tmp, within=layout.cache_anchor) as tmp:
            tree = tmp / PACKAGE
            package_tree(files, {f: ctx.root.local(f) for f in files}, tree)
            daemon = tree / "sbin" / "nvlsm"
            if not daemon.is_file() or not (tree / "share/nvidia/nvlsm/nvlsm.conf").is_file():
                raise NvlsmPackageMismatch(
                    f"{PACKAGE} {found} lacks {PREFIX}/sbin/nvlsm or {SHARE_DIR}/nvlsm.conf "
                    f"(rpm -ql lists {len(files)} files)")
            digest = hashlib.sha256(daemon.read_bytes()).hexdigest()  # what the package vouched
            placed = nvlsm_archive.place(tree, layout, driver, found, digest,
                                         f"{PACKAGE} {found}")
        log.info("NVLSM %s from the %s package into %s: %s", found, PACKAGE,
                 layout.version_dir(driver), ", ".join(placed))

    return Step("install-nvlsm", f"nvlsm, its plugin and config from the host's {spec} package "
                "(NVIDIA's, signed, installed with the driver's transaction) into "
                "versions/<ver>/ beside Fabric Manager", satisfied, apply)


def _dnf_install(ctx: Context, pin: str | None) -> None:
    spec = commands.nvlsm_spec(pin)
    try:
        ctx.runner.run(install_argv(base_argv(ctx), pin), stream=True, timeout=1800)
    except CommandFailed as exc:
        output = exc.output_tail
        if any(marker in output for marker in REPO_DOWN):
            raise repo_down(ctx, output) from exc
        if NO_MATCH in output:
            raise nvlsm_unavailable(ctx, output) from exc
        raise transaction_failed(f"dnf install {spec}", output) from exc
