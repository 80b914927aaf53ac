"""Module files and firmware onto the host: the built modules into /lib/modules (+ depmod), put
back after an unload that failed; the GSP firmware into /lib/firmware."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from installer import host, modules
from installer.dirs import remove_tree
from installer.errors import InstallFailed
from installer.hostroot import write_atomic
from installer.plan import Context, Step
from installer.steps import rollback as load_rollback

log = logging.getLogger(__name__)


def module_files_step(ctx: Context) -> Step:
    """Copy the built modules where the host's modprobe finds them, when /lib/modules is
    writable; otherwise loading falls back to insmod from the cache."""
    layout, target = ctx.layout, ctx.target
    host_dir = layout.host_modules_dir(target.kernel)
    build = layout.module_build(target.version, target.kernel, target.flavour)
    stamp = f"{target.version} {target.flavour}\n"

    def satisfied() -> bool:
        if not modules_dir_writable(ctx, target.kernel):
            return True
        local = ctx.root.local_resolved(host_dir)
        return (local / ".installer-stamp").is_file() and (
            (local / ".installer-stamp").read_text() == stamp
        ) and _same_modules(local, build)

    def apply() -> None:
        load_rollback.note_modules_dir(ctx, ctx.root.local_resolved(host_dir))
        replace_module_files(ctx, build, stamp)
        log.info("installed modules into %s and ran depmod", host_dir)

    return Step("install-module-files", f"modules into {host_dir} (+ depmod)",
                satisfied, apply)


def _same_modules(installed: Path, build: Path) -> bool:
    """The same .ko files, each of the same size and mtime (copy2 keeps the build's): a
    rebuilt or re-pulled cache is copied again (never the stale modules of an earlier build)."""
    names = modules.ko_files(build)
    if modules.ko_files(installed) != names:
        return False
    for name in names:
        a, b = (installed / name).stat(), (build / name).stat()
        if (a.st_size, a.st_mtime_ns) != (b.st_size, b.st_mtime_ns):
            return False
    return True


def replace_module_files(ctx: Context, build: Path | None, stamp: str) -> None:
    """The host's module dir swapped by rename for `build`'s .ko files (None: removed), then
    depmod."""
    kernel = ctx.target.kernel
    local = ctx.root.local_resolved(ctx.layout.host_modules_dir(kernel))
    fresh = local.with_name(local.name + ".new")
    old = local.with_name(local.name + ".old")
    for leftover in (fresh, old):
        remove_tree(leftover)
    if build is not None:
        fresh.mkdir(parents=True)
        for name in modules.ko_files(build):
            shutil.copy2(build / name, fresh / name)
        (fresh / ".installer-stamp").write_text(stamp)
    if local.exists():
        os.replace(local, old)
    if build is not None:
        os.replace(fresh, local)
    remove_tree(old)
    ctx.runner.run(modules.depmod_argv(ctx.root, kernel), timeout=300)


def restore_module_files(ctx: Context, driver: host.LoadedDriver | None) -> None:
    """After an unload that failed: the host's module dir back to the driver still loaded (its
    build from the cache), or emptied of ours when the cache has none, so that a reboot's
    modprobe never loads the new modules under the old user space."""
    kernel = ctx.target.kernel
    host_dir = ctx.layout.host_modules_dir(kernel)
    local = ctx.root.local_resolved(host_dir)
    if not modules_dir_writable(ctx, kernel) or not local.exists():
        return
    version, flavour = (driver.version, driver.flavour) if driver else (None, None)
    stamp = f"{version} {flavour}\n"
    if (local / ".installer-stamp").is_file() and (
            (local / ".installer-stamp").read_text() == stamp):
        return
    build = ctx.layout.module_build(version, kernel, flavour) if version and flavour else None
    if version is None:
        log.info("no driver was installed before: the new modules are taken out of %s",
                 host_dir)
        replace_module_files(ctx, None, "")
        return
    if build is None or not modules.ko_files(build):
        log.warning("the loaded driver %s stays; its modules are not in the cache, so the new "
                    "ones are taken out of %s (the next run puts them back)", version, host_dir)
        replace_module_files(ctx, None, "")
        return
    replace_module_files(ctx, build, stamp)
    log.warning("the loaded driver %s stays: %s holds its modules again", version, host_dir)


def modules_dir_writable(ctx: Context, kernel: str) -> bool:
    base = ctx.root.local_resolved(f"/lib/modules/{kernel}")
    return base.is_dir() and os.access(base, os.W_OK)


def firmware_step(ctx: Context) -> Step:
    """versions/<ver>/firmware onto the host's /lib/firmware/nvidia/<ver>, where the kernel's
    firmware loader looks (open modules and GSP mode fail to start without it)."""
    host_dir = ctx.layout.host_firmware_dir(ctx.target.version)
    source = ctx.layout.version_dir(ctx.target.version) / "firmware"

    def files() -> list[Path]:
        return sorted(p for p in source.glob("*") if p.is_file()) if source.is_dir() else []

    def missing() -> list[Path]:
        dest = ctx.root.local_resolved(host_dir)
        return [item for item in files() if not _same_file(item, dest / item.name)]

    def satisfied() -> bool:
        return not missing()

    def apply() -> None:
        dest = ctx.root.local_resolved(host_dir)
        load_rollback.note_firmware(ctx, dest)  # undone if the load fails
        try:
            for item in missing():
                dest.mkdir(parents=True, exist_ok=True)
                write_atomic(dest / item.name, item.read_bytes(), 0o644)
                os.utime(dest / item.name, ns=(item.stat().st_atime_ns, item.stat().st_mtime_ns))
        except OSError as exc:
            raise InstallFailed(
                f"could not put the GSP firmware of {ctx.target.version} into {host_dir} on the "
                f"host: {exc}",
                hint="The kernel loads it from the host's /lib/firmware: make that directory "
                "writable for the installer (ROOT_MOUNT_DIR mounted read-write).") from exc
        log.info("installed GSP firmware into %s: %s", host_dir,
                 ", ".join(p.name for p in files()))

    return Step("install-firmware", f"GSP firmware into {host_dir} on the host",
                satisfied, apply)


def _same_file(source: Path, dest: Path) -> bool:
    try:
        a, b = source.stat(), dest.stat()
    except OSError:
        return False
    return a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns
