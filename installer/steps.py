"""The steps shared by every source: guards, unload, switch, modules on the host, load, nodes,
ld cache, verification and the install record."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from installer import (
    components,
    gate_steps,
    host,
    ldcache,
    load_rollback,
    modules,
    state,
    upgrade_gate,
)
from installer.dirs import remove_tree
from installer.errors import (
    InstallerError,
    InstallFailed,
    ModuleLoadFailed,
    NouveauActive,
    SecureBootKeysMissing,
)
from installer.hostroot import write_atomic
from installer.layout import NOUVEAU_BLACKLIST, READY_FILE
from installer.plan import Context, Step

log = logging.getLogger(__name__)

NOUVEAU_BLACKLIST_TEXT = "blacklist nouveau\noptions nouveau modeset=0\n"


def secure_boot_refusal(ctx: Context) -> SecureBootKeysMissing | None:
    if ctx.facts.secure_boot.enabled is not True or ctx.config.signing_key is not None:
        return None
    return SecureBootKeysMissing(
        "Secure Boot is enabled on this node and no module signing key is configured: "
        "the kernel would reject the unsigned NVIDIA modules after a long compile "
        f"({ctx.facts.secure_boot.detail})",
    )


def secure_boot_step(ctx: Context) -> Step:
    def satisfied() -> bool:
        return secure_boot_refusal(ctx) is None

    def apply() -> None:
        refusal = secure_boot_refusal(ctx)
        if refusal is not None:
            raise refusal

    return Step("check-secure-boot", "refuse before compiling if Secure Boot would reject "
                "unsigned modules", satisfied, apply)


def nouveau_step(ctx: Context) -> Step:
    def satisfied() -> bool:
        return not _nouveau_loaded(ctx)

    def apply() -> None:
        if ctx.root.read_text(NOUVEAU_BLACKLIST) != NOUVEAU_BLACKLIST_TEXT:
            ctx.root.write_atomic(NOUVEAU_BLACKLIST, NOUVEAU_BLACKLIST_TEXT)
            log.info("blacklisted nouveau in %s", NOUVEAU_BLACKLIST)
        result = ctx.runner.run(["rmmod", "nouveau"], check=False, timeout=60)
        if not result.ok or _nouveau_loaded(ctx):
            raise NouveauActive(
                "the nouveau driver owns the GPU and cannot be unloaded while in use "
                f"({result.output.strip() or 'still loaded'}); it is blacklisted on the host now",
                hint="Reboot the node; after the reboot nouveau stays unloaded and the installer "
                "finishes on its own.",
            )

    return Step("unload-nouveau", "unload and blacklist nouveau, which would own the GPU",
                satisfied, apply)


def _nouveau_loaded(ctx: Context) -> bool:
    return any(m.name == "nouveau" for m in host.loaded_modules(ctx.root))


def unload_old_step(ctx: Context) -> Step:
    target = ctx.target

    def satisfied() -> bool:
        driver = host.loaded_driver(ctx.root)
        if driver is None:
            return not _any_nvidia_loaded(ctx)
        return driver.version == target.version and driver.flavour == target.flavour

    def apply() -> None:
        driver = host.loaded_driver(ctx.root)
        holders = _holders(ctx)
        log.info("replacing loaded driver %s with %s",
                 driver.version if driver else "unknown", target.version)
        try:
            if holders:  # issue 13: freed (cordon, evict, wait) or refused by the gate
                old = (driver.version if driver else None) or "unknown"
                upgrade_gate.of(ctx).free_driver(ctx, holders, old, target.version)
                remove_ready_file(ctx)
                holders = []
            # Issue 21: when the unload goes ahead, the scheduling gate closes first, then our
            # daemons (Fabric Manager, persistenced) stop, then the driver goes.
            gate_steps.close_before_unload(ctx.config, ctx.root, f"unloading driver "
                                           f"{driver.version if driver else 'unknown'} for "
                                           f"{target.version}")
            with components.paused(ctx.root, ctx.layout, ctx.config, when=not holders):
                modules.unload(ctx.root, ctx.runner, holders)
        except InstallerError:
            # The new module files were staged before the unload (issue 9's order).
            if target.stages_module_files:
                restore_module_files(ctx, driver)
            raise
        remove_ready_file(ctx)

    return Step("unload-old-driver", "unload a different driver version that is loaded",
                satisfied, apply)


def _any_nvidia_loaded(ctx: Context) -> bool:
    names = {m.name for m in host.loaded_modules(ctx.root)}
    return any(name in names for name in modules.UNLOAD_ORDER)


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
        load_rollback.note_links(ctx, ("current", *links, "drivers"))  # issue 19
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


def module_files_step(ctx: Context) -> Step:
    """Copy the built modules where the host's modprobe finds them, when /lib/modules is
    writable; otherwise loading falls back to insmod from the cache."""
    layout, target = ctx.layout, ctx.target
    host_dir = layout.host_modules_dir(target.kernel)
    build = layout.module_build(target.version, target.kernel, target.flavour)
    stamp = f"{target.version} {target.flavour}\n"

    def satisfied() -> bool:
        if not _modules_dir_writable(ctx, target.kernel):
            return True
        local = ctx.root.local_resolved(host_dir)
        return (local / ".installer-stamp").is_file() and (
            (local / ".installer-stamp").read_text() == stamp
        ) and _same_modules(local, build)

    def apply() -> None:
        _replace_module_files(ctx, build, stamp)
        log.info("installed modules into %s and ran depmod", host_dir)

    return Step("install-module-files", f"modules into {host_dir} (+ depmod)",
                satisfied, apply)


def _same_modules(installed: Path, build: Path) -> bool:
    """The same .ko files, each of the same size and mtime (copy2 keeps the build's): a
    rebuilt or re-pulled cache is copied again (issue 20)."""
    names = modules.ko_files(build)
    if modules.ko_files(installed) != names:
        return False
    for name in names:
        a, b = (installed / name).stat(), (build / name).stat()
        if (a.st_size, a.st_mtime_ns) != (b.st_size, b.st_mtime_ns):
            return False
    return True


def _replace_module_files(ctx: Context, build: Path | None, stamp: str) -> None:
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
    if not _modules_dir_writable(ctx, kernel) or not local.exists():
        return
    version, flavour = (driver.version, driver.flavour) if driver else (None, None)
    stamp = f"{version} {flavour}\n"
    if (local / ".installer-stamp").is_file() and (
            (local / ".installer-stamp").read_text() == stamp):
        return
    build = ctx.layout.module_build(version, kernel, flavour) if version and flavour else None
    if build is None or not modules.ko_files(build):
        log.warning("the loaded driver %s stays; its modules are not in the cache, so the new "
                    "ones are taken out of %s (the next run puts them back)",
                    version or "unknown", host_dir)
        _replace_module_files(ctx, None, "")
        return
    _replace_module_files(ctx, build, stamp)
    log.warning("the loaded driver %s stays: %s holds its modules again", version, host_dir)


def _modules_dir_writable(ctx: Context, kernel: str) -> bool:
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
        load_rollback.note_firmware(ctx, dest)  # issue 19
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


def driver_free_step(ctx: Context) -> Step:
    """Refuse an upgrade while the loaded driver is held, before anything is staged on the
    host (the unload right before the load checks again). With the upgrade protocol on, the
    protocol frees the driver right before the unload (issue 13); here it only checks that the
    API server answers, so a held upgrade that cannot reach it changes nothing on the host."""

    def satisfied() -> bool:
        if unload_old_step(ctx).is_satisfied():
            return True  # nothing will be unloaded
        if upgrade_gate.of(ctx).cleared_to_stage:
            return True
        return not _driver_held(ctx)

    def apply() -> None:
        upgrade_gate.of(ctx).preflight(ctx, _holders(ctx))

    return Step("check-driver-free", "refuse before staging when the loaded driver is in use "
                "(with the upgrade protocol: check the API server answers)", satisfied, apply)


def driver_free_before_packages_step(ctx: Context, packages: Step) -> Step:
    """dnf source: the driver packages replace the host's user space in /usr as they install,
    so nothing can be staged: a held driver is refused (protocol off) or freed (protocol on:
    cordon, evict, wait) before the transaction, and the host's packages stay as they were
    when that fails. Nothing to do when the packages are already on the target or the loaded
    driver is the planned version."""
    def needs_room() -> bool:
        if upgrade_gate.of(ctx).freed or packages.is_satisfied():
            return False
        driver = host.loaded_driver(ctx.root)
        if driver is None and not _any_nvidia_loaded(ctx):
            return False
        if (driver is not None and not ctx.target.version_pending
                and driver.version == ctx.target.version):
            return False
        return _driver_held(ctx)

    def apply() -> None:
        driver = host.loaded_driver(ctx.root)
        old = (driver.version if driver else None) or "unknown"
        new = "the dnf stream's newest" if ctx.target.version_pending else ctx.target.version
        upgrade_gate.of(ctx).free_driver(
            ctx, _holders(ctx), old, new,
            "the host's driver packages were left as they were (dnf replaces the user "
            "space as it installs, so nothing is staged while the driver is held)")
        remove_ready_file(ctx)

    return Step("check-driver-free", "before the driver packages change the host's user "
                "space: refuse a held driver (with the upgrade protocol: free it)",
                lambda: not needs_room(), apply)


def _driver_held(ctx: Context) -> bool:
    return components.driver_held(ctx.root, ctx.layout, ctx.config)


def _holders(ctx: Context) -> list[str]:
    return components.holders(ctx.root, ctx.layout, ctx.config)


def ld_cache_step(ctx: Context) -> Step:
    layout = ctx.layout

    def satisfied() -> bool:
        return ldcache.is_configured(ctx.root, ctx.runner, layout.lib_dir_host, layout.lib_dir,
                                     ctx.target.version)

    def apply() -> None:
        load_rollback.note_drop_in(ctx)  # issue 19
        ldcache.configure(ctx.root, ctx.runner, layout.lib_dir_host)

    return Step("configure-ld-cache", "ld.so.conf.d drop-in for lib64/ and the host's ldconfig",
                satisfied, apply)


def load_step(ctx: Context) -> Step:
    target = ctx.target

    def satisfied() -> bool:
        return modules.all_loaded(ctx.root, target.version)

    def apply() -> None:
        via_modprobe = _modules_dir_writable(ctx, target.kernel)
        request = modules.LoadRequest(
            kernel=target.kernel,
            via_modprobe=via_modprobe,
            module_dir=ctx.layout.module_build(target.version, target.kernel, target.flavour),
            user_args={modules.kernel_name(m): ctx.config.module_args_for(m)
                       for m in modules.LOAD_ORDER},
        )
        try:
            modules.load(ctx.root, ctx.runner, request)
        except ModuleLoadFailed as exc:
            # Issue 19: a refused load leaves no half-activated install behind.
            undone = load_rollback.undo(ctx, restore_module_files)
            raise ModuleLoadFailed(
                exc.message + (f"; put back: {', '.join(undone)}" if undone else ""),
                hint=exc.hint) from exc

    return Step("load-modules", "load nvidia, nvidia-uvm, nvidia-modeset", satisfied, apply)


def device_nodes_step(ctx: Context) -> Step:
    def nodes() -> list[modules.Node]:
        return modules.expected_nodes(ctx.root, len(ctx.target.gpu_addresses))

    def satisfied() -> bool:
        dev = ctx.layout.dev_dir
        return not (modules.missing_nodes(dev, nodes()) or modules.missing_char_links(dev, nodes()))

    def apply() -> None:
        binary = ctx.layout.bin_dir / "nvidia-modprobe"
        env = {"LD_LIBRARY_PATH": str(ctx.layout.lib_dir)}
        if modules.missing_nodes(ctx.layout.dev_dir, nodes()):
            modules.create_nodes(ctx.runner, binary, len(ctx.target.gpu_addresses), env)
        modules.link_char_nodes(ctx.layout.dev_dir, nodes())

    return Step("create-device-nodes", "nvidia-modprobe: /dev/nvidiaN per GPU, nvidiactl, "
                "modeset, uvm; /dev/char/<major>:<minor> links",
                satisfied, apply)


def verify_step(ctx: Context) -> Step:
    from installer import verify

    target = ctx.target

    def satisfied() -> bool:
        return _ready_matches(ctx) and modules.all_loaded(ctx.root, target.version)

    def apply() -> None:
        report = verify.verify(
            install_dir=ctx.layout.install_local,
            expected_version=target.version,
            expected_gpus=list(target.gpu_addresses),
            runner=ctx.runner,
        )
        for line in report.summary_lines():
            log.info("verify: %s", line)
        if not report.ok:
            remove_ready_file(ctx)
        verify.require_ok(report)
        ctx.root.write_atomic(READY_FILE, state.ready_text(
            target.version, target.flavour, str(ctx.layout.install_host), target.kernel))
        log.info("driver ready: wrote %s", READY_FILE)

    return Step("verify-driver", "nvidia-smi and NVML answer with the planned version and GPUs; "
                "then the readiness file", satisfied, apply)


def record_step(ctx: Context) -> Step:
    layout, target = ctx.layout, ctx.target

    def satisfied() -> bool:
        record = state.read_record(layout.state_file)
        return (
            record is not None
            and (record.version, record.flavour, record.kernel)
            == (target.version, target.flavour, target.kernel)
            and state.read_gke_cache(layout.gke_cache_file).get("CACHE_NVIDIA_DRIVER_VERSION")
            == target.version
        )

    def apply() -> None:
        previous = state.read_record(layout.state_file)
        kernels = sorted({target.kernel, *(previous.kernels if previous else ())})
        record = state.InstallRecord(
            version=target.version,
            flavour=target.flavour,
            kernel=target.kernel,
            source=target.source,
            install_dir=str(layout.install_host),
            gpus=target.gpu_addresses,
            kernels=tuple(kernels),
            verified_at=state.utc_now() if target.load else "",
        )
        state.write_record(layout.state_file, record)
        write_atomic(layout.gke_cache_file, state.gke_cache_text(target.kernel, target.version))

    return Step("record-install", "install record and GKE's .cache",
                satisfied, apply)


def _ready_matches(ctx: Context) -> bool:
    target = ctx.target
    return ctx.root.read_text(READY_FILE) == state.ready_text(
        target.version, target.flavour, str(ctx.layout.install_host), target.kernel
    )


def remove_ready_file(ctx: Context) -> None:
    path = ctx.root.local(READY_FILE)
    if path.exists():
        path.unlink()
        log.info("removed %s", READY_FILE)


def prune_step(ctx: Context) -> Step:
    """Drivers are large (a .run ~400 MB, extracted ~1 GB): once a version is recorded, keep
    only what it needs (its user space, its .run, its modules for every kernel built) and
    drop the extracted tree and every other version."""
    layout, target = ctx.layout, ctx.target

    def keep(path: Path) -> bool:
        name = path.name
        if path.parent == layout.downloads:
            return name.startswith(f"NVIDIA-Linux-{ctx.facts.arch}-{target.version}.run") or (
                components.keeps_download(name, target.version, ctx.facts.arch))  # issue 21
        return name == target.version and path.parent != layout.cache_local / "extracted"

    def leftovers() -> list[Path]:
        found = []
        for parent in (layout.install_local / "versions", layout.cache_local / "modules",
                       layout.cache_local / "extracted", layout.downloads):
            if parent.is_dir():
                found += [p for p in sorted(parent.iterdir()) if not keep(p)]
        return found

    def satisfied() -> bool:
        return not leftovers()

    def apply() -> None:
        for path in leftovers():
            size = _tree_bytes(path)
            remove_tree(path)
            log.info("pruned %s (%.1f MB)", path, size / 1e6)

    keeping = "the version dnf installs" if target.version_pending else target.version
    return Step("prune-cache", f"keep only {keeping}: drop other versions and the "
                "extracted tree", satisfied, apply)


def _tree_bytes(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*"))
