"""Guards before anything changes on the host: Secure Boot would reject unsigned modules,
nouveau owns the GPU, the loaded driver is held (the upgrade gate refuses or frees it)."""

from __future__ import annotations

import logging

from installer import components, host
from installer.cluster import upgrade_gate
from installer.errors import NouveauActive, SecureBootKeysMissing
from installer.layout import NOUVEAU_BLACKLIST
from installer.plan import Context, Step
from installer.steps.activation import any_nvidia_loaded, holders_of_driver, unload_old_step
from installer.steps.load import remove_ready_file

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


def driver_free_step(ctx: Context) -> Step:
    """Refuse an upgrade while the loaded driver is held, before anything is staged on the
    host (the unload right before the load checks again). With the upgrade protocol on, the
    protocol frees the driver right before the unload; here it only checks that the
    API server answers, so a held upgrade that cannot reach it changes nothing on the host."""

    def satisfied() -> bool:
        if unload_old_step(ctx).is_satisfied():
            return True  # nothing will be unloaded
        if upgrade_gate.of(ctx).cleared_to_stage:
            return True
        return not _driver_held(ctx)

    def apply() -> None:
        upgrade_gate.of(ctx).preflight(ctx, holders_of_driver(ctx))

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
        if driver is None and not any_nvidia_loaded(ctx):
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
            ctx, holders_of_driver(ctx), old, new,
            "the host's driver packages were left as they were (dnf replaces the user "
            "space as it installs, so nothing is staged while the driver is held)")
        remove_ready_file(ctx)

    return Step("check-driver-free", "before the driver packages change the host's user "
                "space: refuse a held driver (with the upgrade protocol: free it)",
                lambda: not needs_room(), apply)


def _driver_held(ctx: Context) -> bool:
    return components.driver_held(ctx.root, ctx.layout, ctx.config)
