"""The install dir from the dnf source's packages: versions/<ver>/{bin,lib64} from their
files, the module cache from what DKMS or the precompiled kmod put in /lib/modules/<k>/extra."""

from __future__ import annotations

import logging
import lzma
import os
import shutil
from pathlib import Path, PurePosixPath

from installer import kmod
from installer.dirs import is_complete, mark_complete, remove_tree, staged_dir
from installer.errors import InstallFailed
from installer.plan import Context, Step
from installer.sources.dnf import commands, host_state
from installer.sources.dnf.commands import DnfTarget

log = logging.getLogger(__name__)


def populate_step(ctx: Context, dt: DnfTarget) -> Step:
    """versions/<ver>/{bin,lib64} from the packages' files (GKE's layout that consumers mount),
    and the modules DKMS or the precompiled kmod put in /lib/modules/<k>/extra in the module
    cache, uncompressed (the `drivers` link, the insmod fallback). The modules stay where they
    are; depmod makes modprobe find them."""
    layout, t = ctx.layout, ctx.target

    def satisfied() -> bool:
        return is_complete(layout.version_dir(t.version)) and is_complete(
            layout.module_build(t.version, t.kernel, t.flavour))

    def apply() -> None:
        version = t.version
        present = host_state.installed_versions(ctx.root, ctx.runner, list(commands.USERSPACE_ALL))
        userspace = sorted(n for n, v in present.items() if v == version)
        final = layout.version_dir(version)
        if not is_complete(final):
            _fill_version_dir(ctx, _package_files(ctx, userspace), final, version)
        build = layout.module_build(version, t.kernel, t.flavour)
        if not is_complete(build):
            _fill_module_dir(ctx, build)
        _retire_runfile_modules(ctx)
        if _writable(ctx.root.local(f"/lib/modules/{t.kernel}")):
            ctx.runner.run(kmod.depmod_argv(ctx.root, t.kernel), timeout=300)

    return Step(
        "populate-install-dir",
        "versions/<ver>/{bin,lib64} and the module cache from the installed packages' files",
        satisfied,
        apply,
    )


def _package_files(ctx: Context, names: list[str]) -> list[PurePosixPath]:
    result = ctx.runner.run(commands.rpm_files_argv(ctx.root, names), timeout=120)
    return [
        PurePosixPath(line.strip()) for line in result.output.splitlines() if line.startswith("/")
    ]


def _fill_version_dir(ctx: Context, files: list[PurePosixPath], final: Path, version: str) -> None:
    with staged_dir(final, within=ctx.layout.anchor_for(final)) as staging:
        (staging / "bin").mkdir()
        (staging / "lib64").mkdir()
        count = 0
        for path in files:
            local = ctx.root.local(path)
            if local.is_symlink() or not local.is_file():
                continue
            if path.parent.name == "bin" and path.name.startswith("nvidia-"):
                _link_or_copy(local, staging / "bin" / path.name)
            elif path.parent.name in ("lib64", "lib") and ".so." in path.name:
                _link_or_copy(local, staging / "lib64" / path.name)
            else:
                continue
            count += 1
        if not (staging / "bin" / "nvidia-smi").is_file():
            raise InstallFailed(
                f"the installed packages of {version} have no nvidia-smi (rpm -ql listed none)"
            )
        ctx.runner.run(["ldconfig", "-n", str(staging / "lib64")], timeout=120)
        mark_complete(staging, version + "\n")
    log.info("filled %s with %d files from the packages", final, count)


def _fill_module_dir(ctx: Context, build: Path) -> None:
    t = ctx.target
    found = host_state.module_files(ctx.root, t.kernel)
    if "nvidia" not in found:
        raise InstallFailed(
            f"no nvidia module for kernel {t.kernel} under /lib/modules/{t.kernel}/extra",
            hint="DKMS builds for the running kernel; check `dkms status` on the node and "
            "that kernel-devel matches the kernel.",
        )
    with staged_dir(build, within=ctx.layout.anchor_for(build)) as staging:
        for name, path in found.items():
            dest = staging / f"{name}.ko"
            if path.name.endswith(".ko.xz"):
                with lzma.open(path) as packed, open(dest, "wb") as out:
                    shutil.copyfileobj(packed, out)
            elif path.name.endswith(".ko.zst"):
                ctx.runner.run(["zstd", "-d", "-q", "-f", "-o", str(dest), str(path)],
                               timeout=120)
            else:
                _link_or_copy(path, dest)
        mark_complete(staging, f"{t.version} {t.kernel} {t.flavour}\n")


def _retire_runfile_modules(ctx: Context) -> None:
    """A runfile install's modules sit in updates/, which modprobe prefers over extra/."""
    ours = ctx.root.local(ctx.layout.host_modules_dir(ctx.target.kernel))
    if ours.exists():
        remove_tree(ours)
        log.info("removed the runfile install's modules in %s", ours)


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)
