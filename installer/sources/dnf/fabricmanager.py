"""Fabric Manager on dnf hosts: NVIDIA's package of the driver's exact version comes with the
driver's own dnf transaction (the stream's `fm` profile, dnf_commands.py); this puts its daemon,
config and topology files into versions/<ver>/ as the archive's are, so `installer
fabricmanager` runs it from the install dir like any other install."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from installer.components import fm_archive
from installer.dirs import scratch
from installer.errors import FabricManagerMismatch
from installer.plan import Context, Step
from installer.sources.dnf import commands, host_state

log = logging.getLogger(__name__)

BIN_DIR = PurePosixPath("/usr/bin")
SHARE_DIR = PurePosixPath("/usr/share/nvidia/nvswitch")
HINT = ("The driver's dnf transaction installs Fabric Manager from the stream's `fm` profile: "
        "check that the repo's {name} is {version} and carries /usr/bin/nv-fabricmanager, or "
        "set NVIDIA_FABRICMANAGER=false when the host runs its own Fabric Manager.")


def copy_files(files: list[PurePosixPath], local: dict[PurePosixPath, Path],
               dest_of: Callable[[PurePosixPath], Path | None]) -> list[str]:
    """A package's regular files (host path -> file here) copied where `dest_of` puts them
    (None: not wanted); returns the host paths taken. Shared with NVLSM's package."""
    taken = []
    for path in files:
        source = local[path]
        dest = dest_of(path)
        if dest is None or source.is_symlink() or not source.is_file():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)
        taken.append(str(path))
    return taken


def package_tree(files: list[PurePosixPath], local: dict[PurePosixPath, Path], tree: Path
                 ) -> list[str]:
    """The package's files (host path -> file here) copied into `tree` in the archive's layout
    (bin/, etc/fabricmanager.cfg, share/nvidia/nvswitch/); returns the host paths taken."""

    def dest_of(path: PurePosixPath) -> Path | None:
        if path.parent == BIN_DIR:
            return tree / "bin" / path.name
        if path == SHARE_DIR / "fabricmanager.cfg":
            return tree / "etc" / "fabricmanager.cfg"
        if path.parent == SHARE_DIR:
            return tree / "share" / "nvidia" / "nvswitch" / path.name
        return None

    return copy_files(files, local, dest_of)


def install_step(ctx: Context) -> Step:
    layout = ctx.layout

    def satisfied() -> bool:
        return fm_archive.installed(layout, ctx.target.version)

    def apply() -> None:
        version = ctx.target.version  # what the dnf transaction installed
        name = commands.fabricmanager_package(version)
        hint = HINT.format(name=name, version=version)
        found = host_state.installed_versions(ctx.root, ctx.runner, [name]).get(name)
        if found != version:
            raise FabricManagerMismatch(
                f"the host's {name} is {found or 'not installed'}, not the driver's {version}",
                hint=hint)
        listed = ctx.runner.run(commands.rpm_files_argv(ctx.root, [name]), timeout=120).output
        files = [PurePosixPath(line.strip()) for line in listed.splitlines()
                 if line.startswith("/")]
        with scratch(layout.tmp, within=layout.cache_anchor) as tmp:
            tree = tmp / "fabricmanager"
            package_tree(files, {f: ctx.root.local(f) for f in files}, tree)
            daemon = tree / "bin" / fm_archive.binary(layout, version).name
            if not daemon.is_file() or not (tree / "etc" / "fabricmanager.cfg").is_file():
                raise FabricManagerMismatch(
                    f"{name} {version} lacks {BIN_DIR}/nv-fabricmanager or "
                    f"{SHARE_DIR}/fabricmanager.cfg (rpm -ql lists {len(files)} files)",
                    hint=hint)
            said = fm_archive.reported_version(ctx.runner, daemon)
            if said != version:
                raise FabricManagerMismatch(
                    f"{name} {version}'s nv-fabricmanager says it is {said or '(no version)'}: "
                    "it would refuse the driver", hint=hint)
            placed = fm_archive.install(tree, layout.version_dir(version),
                                        fm_archive.config_dir(layout, version), version,
                                        within=layout.install_local)
        log.info("Fabric Manager %s from %s into %s: %s", version, name,
                 layout.version_dir(version), ", ".join(placed))

    return Step("install-fabricmanager", "nv-fabricmanager, its config and topology files from "
                "the host's Fabric Manager package (the stream's fm profile) into versions/<ver>/",
                satisfied, apply)
