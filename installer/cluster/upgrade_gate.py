"""The upgrade gate: what stands between a held driver and its unload, chosen once per run from
NVIDIA_INSTALLER_UPGRADE_PROTOCOL. Off, a held driver is refused (and a node an earlier run left
mid-upgrade is restored after the run); on, the node-side upgrade protocol (cordon,
evict, wait) frees it, and the node is restored or marked failed after the run. Steps and `app`
ask the gate; none of them tests the switch."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from installer import components, kmod
from installer.config import Config
from installer.errors import InstallerError
from installer.layout import Layout

if TYPE_CHECKING:
    from installer.cluster.pools import Pool
    from installer.plan import Context, UpgradeGate

log = logging.getLogger(__name__)

# protocol.HINT_NAME: the local marker of an upgrade the protocol began (not imported here, so
# that a run with the protocol off never loads the cluster code for it).
MID_UPGRADE_MARKER = ".upgrade-protocol"


class RefusingGate:
    """The upgrade protocol off: a held driver is never taken away from its users."""

    def __init__(self, pool: Pool | None = None) -> None:
        self.cleared_to_stage = False
        self.freed = False
        self.pool = pool

    def preflight(self, ctx: Context, holders: Sequence[str]) -> None:
        raise kmod.in_use_error(holders, kmod.loaded_modules(ctx.root))

    def free_driver(self, ctx: Context, holders: Sequence[str], old: str, new: str,
                    detail: str = "") -> None:
        raise kmod.in_use_error(holders, kmod.loaded_modules(ctx.root), detail)

    def finished(self, config: Config, layout: Layout) -> None:
        # A node an earlier run left mid-upgrade (its marker, protocol.HINT_NAME) is
        # restored even with the protocol switched off since; the warm path only stats a file.
        if (layout.install_local / MID_UPGRADE_MARKER).exists():
            from installer.cluster import protocol

            protocol.finish_switched_off(config, layout)

    def failed(self, config: Config, layout: Layout, error: InstallerError) -> None:
        return None


class ClusterGate:
    """The upgrade protocol on: the node is cordoned, its GPU clients paused and its
    GPU pods evicted until the driver is free; restored after the run. The cluster code is
    imported only when a method runs."""

    def __init__(self, pool: Pool | None = None) -> None:
        self.cleared_to_stage = False
        self.freed = False
        self.pool = pool

    def preflight(self, ctx: Context, holders: Sequence[str]) -> None:
        from installer.cluster import protocol

        protocol.preflight(ctx.config)
        self.cleared_to_stage = True
        log.info("the loaded driver is held: the upgrade protocol frees it right before the "
                 "unload")

    def free_driver(self, ctx: Context, holders: Sequence[str], old: str, new: str,
                    detail: str = "") -> None:
        from installer.cluster import protocol

        pool = self.pool

        def make_room() -> None:
            # The pool only where a pool policy chose one (its budget is waited for first).
            if pool is None:
                protocol.make_room(ctx.config, ctx.root, ctx.layout, old, new)
            else:
                protocol.make_room(ctx.config, ctx.root, ctx.layout, old, new, pool=pool)

        components.pause_for(ctx.root, ctx.layout, ctx.config, make_room)
        self.freed = True

    def finished(self, config: Config, layout: Layout) -> None:
        from installer.cluster import protocol

        protocol.finish(config, layout)

    def failed(self, config: Config, layout: Layout, error: InstallerError) -> None:
        from installer.cluster import protocol

        protocol.failed(config, layout, error)


def choose(config: Config, pool: Pool | None = None) -> UpgradeGate:
    """The gate for a run with `config` (the planner's choice, made once per run); `pool` is
    the node's rule of a pool policy, whose maxUpgrading budget the upgrade waits for."""
    return ClusterGate(pool) if config.upgrade_protocol else RefusingGate()


def of(ctx: Context) -> UpgradeGate:
    """The gate the planner chose for this run; chosen here, once, for a context built without
    the planner."""
    if ctx.upgrade_gate is None:
        ctx.upgrade_gate = choose(ctx.config)
    return ctx.upgrade_gate
