"""When the kernel refuses the new modules: the node back as it was before this run.

The steps before `load-modules` stage the new driver on the host (module files and depmod, GSP
firmware, the install dir's links, the ld.so.conf.d drop-in) so the unload and the load run
back to back. A load the kernel refuses (no GPU it supports, a GPU it cannot start, a
signature) must not leave that half-activated: each staging step notes what it found before it
changed it, and `undo` puts those things back, the readiness file absent.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from installer import host, state
from installer.dirs import remove_tree
from installer.layout import GPUS_READY_FILE, LD_DROP_IN, READY_FILE
from installer.plan import Context
from installer.steps import ldcache

log = logging.getLogger(__name__)

LINKS = "rollback-links"  # name -> the link's target before activate-install (None: absent)
FIRMWARE = "rollback-firmware"  # the highest firmware dir install-firmware created in this run
MODULES_DIR = "rollback-modules-dir"  # the highest module dir install-module-files created
DROP_IN = "rollback-drop-in"  # True when configure-ld-cache wrote the drop-in in this run


def note_links(ctx: Context, names: tuple[str, ...]) -> None:
    if LINKS in ctx.memo:
        return
    install = ctx.layout.install_local
    ctx.memo[LINKS] = {name: os.readlink(install / name) if (install / name).is_symlink()
                       else None for name in names}


def _first_missing(path: Path) -> Path | None:
    """The highest directory of `path` that does not exist yet (what a mkdir -p creates)."""
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def note_firmware(ctx: Context, host_dir: Path) -> None:
    if FIRMWARE not in ctx.memo:
        ctx.memo[FIRMWARE] = _first_missing(host_dir)


def note_modules_dir(ctx: Context, local_dir: Path) -> None:
    """Before the new modules go into `local_dir` (/lib/modules/<k>/updates/...): a first
    install creates updates/ too, which a refused load must not leave behind."""
    if MODULES_DIR not in ctx.memo:
        ctx.memo[MODULES_DIR] = _first_missing(local_dir)


def note_drop_in(ctx: Context) -> None:
    if DROP_IN not in ctx.memo:
        ctx.memo[DROP_IN] = not ctx.root.local_resolved(LD_DROP_IN).exists()


RestoreModules = Callable[[Context, "host.LoadedDriver | None"], None]


def undo(ctx: Context, restore_module_files: RestoreModules) -> list[str]:
    """Put back what this run staged; returns what it did, for the error message. Never
    raises: the load's failure is what the caller reports. `restore_module_files` puts the
    host's module dir back to a driver's build (steps/placement.py's, shared with a failed
    unload)."""
    done: list[str] = []
    try:
        links = ctx.memo.get(LINKS)
        if isinstance(links, dict):
            install = ctx.layout.install_local
            for name, old in links.items():
                path = install / name
                if old is None:
                    if path.is_symlink():
                        path.unlink()
                elif not (path.is_symlink() and os.readlink(path) == old):
                    fresh = path.with_name(f".{name}.rollback")
                    if fresh.is_symlink():
                        fresh.unlink()
                    os.symlink(old, fresh)
                    os.replace(fresh, path)
            done.append("the install dir's links as they were")
        record = state.read_record(ctx.layout.state_file)
        before = (host.LoadedDriver(record.version, record.flavour, "")  # type: ignore[arg-type]
                  if record else None)
        restore_module_files(ctx, before)
        created = ctx.memo.get(MODULES_DIR)
        if before is None and isinstance(created, Path) and created.exists():
            # A first install made it: nothing in it was the host's. (After an earlier
            # install it holds that driver's modules again, for the next boot's modprobe.)
            remove_tree(created)
        done.append(f"{ctx.layout.host_modules_dir(ctx.target.kernel)} as it was")
        firmware = ctx.memo.get(FIRMWARE)
        if isinstance(firmware, Path) and firmware.exists():
            remove_tree(firmware)
            done.append(f"{ctx.layout.host_firmware_dir(ctx.target.version)} removed")
        if ctx.memo.get(DROP_IN) is True:
            ldcache.remove(ctx.root, ctx.runner)
            done.append(f"{LD_DROP_IN} removed")
        ctx.root.local(GPUS_READY_FILE).unlink(missing_ok=True)
        ready = ctx.root.local(READY_FILE)
        if ready.exists():
            ready.unlink()
    except Exception as exc:  # the refusal stays the error; this only adds to it
        log.error("could not put everything back after the failed load: %s", exc)
    for item in done:
        log.info("rolled back: %s", item)
    return done
