"""The switch from the old driver to the new one: the old one unloaded (freed by the upgrade
gate when held), current/bin/lib64/drivers pointed at the new version, the ld cache."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from installer import components, host, kmod
from installer.cluster import scheduling_gate_steps, upgrade_gate
from installer.errors import InstallerError
from installer.plan import Context, Step
from installer.steps import ldcache, rollback
from installer.steps.load import remove_ready_file
from installer.steps.placement import restore_module_files

log = logging.getLogger(__name__)


def unload_old_step(ctx: Context) -> Step:
    target = ctx.target

    def satisfied() -> bool:
        driver = host.loaded_driver(ctx.root)
        if driver is None:
            return not any_nvidia_loaded(ctx)
        return driver.version == target.version and driver.flavour == target.flavour

    def apply() -> None:
        driver = host.loaded_driver(ctx.root)
        holders = holders_of_driver(ctx)
        log.info("replacing loaded driver %s with %s",
                 driver.version if driver else "unknown", target.version)
        try:
            if holders:  # freed (cordon, evict, wait) or refused by the gate
                old = (driver.version if driver else None) or "unknown"
                upgrade_gate.of(ctx).free_driver(ctx, holders, old, target.version)
                remove_ready_file(ctx)
                holders = []
            # When the unload goes ahead, the scheduling gate closes first, then our
            # daemons (Fabric Manager, persistenced) stop, then the driver goes.
            scheduling_gate_steps.close_before_unload(ctx.config, ctx.root, f"unloading driver "
                                           f"{driver.version if driver else 'unknown'} for "
                                           f"{target.version}")
            with components.paused(ctx.root, ctx.layout, ctx.config, when=not holders):
                kmod.unload(ctx.root, ctx.runner, holders)
        except InstallerError:
            # The new module files were staged before the unload (so that unload and load
            # are back to back): put the old ones back.
            if target.stages_module_files:
                restore_module_files(ctx, driver)
            raise
        remove_ready_file(ctx)

    return Step("unload-old-driver", "unload a different driver version that is loaded",
                satisfied, apply)


def any_nvidia_loaded(ctx: Context) -> bool:
    names = {m.name for m in host.loaded_modules(ctx.root)}
    return any(name in names for name in kmod.UNLOAD_ORDER)


def holders_of_driver(ctx: Context) -> list[str]:
    return components.holders(ctx.root, ctx.layout, ctx.config)


def activate_step(ctx: Context) -> Step:
    layout, target = ctx.layout, ctx.target
    links = {
        "bin": Path("current") / "bin",
        "lib64": Path("current") / "lib64",
    }

    def drivers_target() -> str:
        build = layout.module_build(target.version, target.kernel, target.flavour)
        return os.path.relpath(build, layout.install_local)

    def satisfied() -> bool:
        wanted = {**{k: str(v) for k, v in links.items()}, "drivers": drivers_target(),
                  "current": str(Path("versions") / target.version)}
        return all(_link_is(layout.install_local / name, dest) for name, dest in wanted.items())

    def apply() -> None:
        install = layout.install_local
        _retire_old_layout(install, ("bin", "lib64", "drivers", "current"))
        rollback.note_links(ctx, ("current", *links, "drivers"))  # undone if the load fails
        _swap_link(install / "current", str(Path("versions") / target.version))
        for name, dest in links.items():
            _swap_link(install / name, str(dest))
        _swap_link(install / "drivers", drivers_target())
        log.info("activated %s in %s", target.version, layout.install_host)

    return Step("activate-install", "point current, bin/, lib64/ and drivers/ at this version",
                satisfied, apply)


def _link_is(path: Path, dest: str) -> bool:
    return path.is_symlink() and os.readlink(path) == dest


def _swap_link(path: Path, dest: str) -> None:
    """Replace `path` with a symlink to `dest` in one rename."""
    tmp = path.with_name(f".{path.name}.new")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(dest, tmp)
    os.replace(tmp, path)


def _retire_old_layout(install: Path, names: tuple[str, ...]) -> None:
    """GKE's entrypoint left real directories where our links go: keep them aside."""
    real = [n for n in names if (install / n).exists() and not (install / n).is_symlink()]
    if not real:
        return
    aside = install / "previous-layout" / time.strftime("%Y%m%dT%H%M%S")
    aside.mkdir(parents=True, exist_ok=True)
    for name in real:
        os.replace(install / name, aside / name)
    log.info("moved the previous layout's %s to %s", ", ".join(real), aside)


def ld_cache_step(ctx: Context) -> Step:
    layout = ctx.layout

    def satisfied() -> bool:
        return ldcache.is_configured(ctx.root, ctx.runner, layout.lib_dir_host, layout.lib_dir,
                                     ctx.target.version)

    def apply() -> None:
        rollback.note_drop_in(ctx)  # undone if the load fails
        ldcache.configure(ctx.root, ctx.runner, layout.lib_dir_host)

    return Step("configure-ld-cache", "ld.so.conf.d drop-in for lib64/ and the host's ldconfig",
                satisfied, apply)
