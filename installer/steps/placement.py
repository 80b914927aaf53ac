"""Module files and firmware onto the host: the built modules into /lib/modules (+ depmod), put
back after an unload that failed; the GSP firmware into /lib/firmware."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from installer import host, kmod, safefs
from installer.dirs import remove_tree
from installer.errors import InstallFailed, PlantedLink
from installer.layout import MODULES_SUBDIR
from installer.plan import Context, Step
from installer.steps import rollback

log = logging.getLogger(__name__)


def module_files_step(ctx: Context) -> Step:
    """Copy the built modules where the host's modprobe finds them, when /lib/modules is
    writable; otherwise loading falls back to insmod from the cache."""
    layout, target = ctx.layout, ctx.target
    host_dir = layout.host_modules_dir(target.kernel)
    build = layout.module_build(target.version, target.kernel, target.flavour)
    stamp = f"{target.version} {target.flavour}\n"

    def satisfied() -> bool:
        if not kmod.modules_dir_writable(ctx.root, target.kernel):
            return True
        base, local = module_dirs(ctx, target.kernel)
        return _stamp(base, local) == stamp and _same_modules(local, build)

    def apply() -> None:
        rollback.note_modules_dir(ctx, module_dirs(ctx, target.kernel)[1])
        replace_module_files(ctx, build, stamp)
        log.info("installed modules into %s and ran depmod", host_dir)

    return Step("install-module-files", f"modules into {host_dir} (+ depmod)",
                satisfied, apply)


def module_dirs(ctx: Context, kernel: str) -> tuple[Path, Path]:
    """The host's /lib/modules/<kernel> (found as the host finds it: /lib may be a link to
    usr/lib) and our directory below it, which is reached from there without following a
    link: other pods mount the module tree."""
    base = ctx.root.local_resolved(f"/lib/modules/{kernel}")
    return base, base.joinpath(*MODULES_SUBDIR.split("/"))


def _stamp(base: Path, local: Path) -> str | None:
    try:
        return safefs.read_bytes(local / ".installer-stamp", anchor=base).decode(
            errors="replace")
    except (OSError, PlantedLink):
        return None


def _copy_into(source: Path, dest: Path, anchor: Path) -> None:
    """`source` copied to the new file `dest` (never through a link), its mode and times
    kept (the probe compares sizes and mtimes)."""
    info = source.stat()
    fd = safefs.open_file(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, anchor=anchor)
    with os.fdopen(fd, "wb") as out, source.open("rb") as src:
        shutil.copyfileobj(src, out)
        out.flush()
        os.fchmod(out.fileno(), info.st_mode & 0o777)
        os.utime(out.fileno(), ns=(info.st_atime_ns, info.st_mtime_ns))


def _same_modules(installed: Path, build: Path) -> bool:
    """The same .ko files, each of the same size and mtime (copy2 keeps the build's): a
    rebuilt or re-pulled cache is copied again (never the stale modules of an earlier build)."""
    names = kmod.ko_files(build)
    if kmod.ko_files(installed) != names:
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
    base, local = module_dirs(ctx, kernel)
    fresh = local.with_name(local.name + ".new")
    old = local.with_name(local.name + ".old")
    for leftover in (fresh, old):
        remove_tree(leftover, within=base)
    if build is not None:
        safefs.make_dirs(fresh, anchor=base)
        for name in kmod.ko_files(build):
            _copy_into(build / name, fresh / name, base)
        safefs.write_atomic(fresh / ".installer-stamp", stamp, anchor=base)
    if os.path.lexists(local):
        safefs.rename(local, old, anchor=base)
    if build is not None:
        safefs.rename(fresh, local, anchor=base)
    remove_tree(old, within=base)
    ctx.runner.run(kmod.depmod_argv(ctx.root, kernel), timeout=300)


def restore_module_files(ctx: Context, driver: host.LoadedDriver | None) -> None:
    """After an unload that failed: the host's module dir back to the driver still loaded (its
    build from the cache), or emptied of ours when the cache has none, so that a reboot's
    modprobe never loads the new modules under the old user space."""
    kernel = ctx.target.kernel
    host_dir = ctx.layout.host_modules_dir(kernel)
    base, local = module_dirs(ctx, kernel)
    if not kmod.modules_dir_writable(ctx.root, kernel) or not local.exists():
        return
    version, flavour = (driver.version, driver.flavour) if driver else (None, None)
    stamp = f"{version} {flavour}\n"
    if _stamp(base, local) == stamp:
        return
    build = ctx.layout.module_build(version, kernel, flavour) if version and flavour else None
    if version is None:
        log.info("no driver was installed before: the new modules are taken out of %s",
                 host_dir)
        replace_module_files(ctx, None, "")
        return
    if build is None or not kmod.ko_files(build):
        log.warning("the loaded driver %s stays; its modules are not in the cache, so the new "
                    "ones are taken out of %s (the next run puts them back)", version, host_dir)
        replace_module_files(ctx, None, "")
        return
    replace_module_files(ctx, build, stamp)
    log.warning("the loaded driver %s stays: %s holds its modules again", version, host_dir)


def firmware_step(ctx: Context) -> Step:
    """versions/<ver>/firmware onto the host's /lib/firmware/nvidia/<ver>, where the kernel's
    firmware loader looks (open modules and GSP mode fail to start without it)."""
    host_dir = ctx.layout.host_firmware_dir(ctx.target.version)
    source = ctx.layout.version_dir(ctx.target.version) / "firmware"

    def files() -> list[Path]:
        return sorted(p for p in source.glob("*") if p.is_file()) if source.is_dir() else []

    def dirs() -> tuple[Path, Path]:
        # /lib/firmware as the host finds it; nvidia/<ver> below it reached without a link.
        base = ctx.root.local_resolved("/lib/firmware")
        return base, base.joinpath(*host_dir.relative_to("/lib/firmware").parts)

    def missing() -> list[Path]:
        dest = dirs()[1]
        return [item for item in files() if not _same_file(item, dest / item.name)]

    def satisfied() -> bool:
        return not missing()

    def apply() -> None:
        base, dest = dirs()
        safefs.check(dest, anchor=base)  # before the rollback notes what to take away
        rollback.note_firmware(ctx, dest)  # undone if the load fails
        try:
            for item in missing():
                safefs.make_dirs(dest, anchor=base)
                safefs.write_atomic(dest / item.name, item.read_bytes(), 0o644, anchor=base)
                os.utime(dest / item.name, ns=(item.stat().st_atime_ns, item.stat().st_mtime_ns),
                         follow_symlinks=False)
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
        a, b = source.stat(), os.lstat(dest)  # a link there is never our file
    except OSError:
        return False
    return a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns
