"""The scheduling gate in a run: closed at the start while the node is not ready,
opened at the end once it is, closed again before a driver is unloaded (upgrade, uninstall).
The Kubernetes side is installer/cluster/scheduling_gate.py, loaded only with the gate on."""

from __future__ import annotations

import logging

from installer import components, host
from installer.config import Config
from installer.errors import SchedulingGateUnavailable
from installer.host import readiness
from installer.hostroot import HostRoot
from installer.layout import GPUS_READY_FILE, READY_FILE, Layout
from installer.plan import Context, Step

log = logging.getLogger(__name__)


def close_step(ctx: Context) -> Step:
    """First in the plan: a node that is not ready (after a reboot the kubelet does not put its
    registration taints back), or whose driver packages dnf is about to replace, is tainted
    before anything else happens. An API server that does not answer is only a warning here:
    the driver is installed all the same, and the run fails at its end if it still cannot
    open the gate."""
    done = "scheduling-gate-closed"

    def why() -> str | None:
        # The driver's readiness only: the components' containers start after this run (their
        # files are gone while the pod restarts); `installer gate` watches those.
        waiting = readiness.driver_pending(ctx.root)
        if waiting:
            return "; ".join(waiting)
        loaded = host.loaded_driver(ctx.root)
        t = ctx.target
        if t.replaces_user_space_before_unload and loaded is not None and (
                loaded.version, loaded.flavour) != (t.version, t.flavour):
            return (f"{t.source} replaces the user space of the loaded driver {loaded.version} "
                    f"with {t.version}")
        return None

    def satisfied() -> bool:
        return bool(ctx.memo.get(done)) or why() is None

    def apply() -> None:
        from installer.cluster import scheduling_gate

        try:
            scheduling_gate.close(ctx.config, why() or "not ready")
        except SchedulingGateUnavailable as error:
            log.warning("%s; installing the driver anyway: the run fails at its end unless the "
                        "API server answers by then", error.message)
        ctx.memo[done] = True

    return Step("close-scheduling-gate", f"taint the node {ctx.config.gate_taint}:NoSchedule "
                "while it is not ready", satisfied, apply)


def open_step(ctx: Context) -> Step:
    """Last in the plan: untaint and label once readiness.pending(...) is empty (the readiness
    file verify wrote, the driver it names loaded, every component that applies up). When a
    component is still coming up in its own container, the gate stays closed and the
    scheduling-gate container (`installer gate`) opens it. Raises the gate's errors."""
    done = "scheduling-gate-opened"

    def apply() -> None:
        waiting = readiness.pending(ctx.root, components.names())
        if waiting:
            log.info("the scheduling gate stays closed (%s): %s; the scheduling-gate container "
                     "opens it once that changes", ctx.config.gate_taint, "; ".join(waiting))
        else:
            from installer.cluster import scheduling_gate

            version = readiness.verified_version(ctx.root)
            assert version is not None  # nothing pending: the verified driver is loaded
            scheduling_gate.open_for(ctx.config, version)
        ctx.memo[done] = True

    return Step("open-scheduling-gate", "untaint the node and label it with the verified "
                "version once the driver and what it needs are up",
                lambda: bool(ctx.memo.get(done)), apply)


def close_before_unload(config: Config, root: HostRoot, why: str, *,
                        drop_label: bool = False) -> None:
    """Right before a driver is unloaded, with the gate on: the readiness file goes first (so
    nothing opens the gate again), then the taint goes on. Nothing when the unload will not go
    ahead (a process other than our daemons holds /dev/nvidia*, a module is in use: the unload
    refuses and the driver keeps working). Our daemons (Fabric Manager, persistenced) are
    stopped after this, right before the unload. Raises the gate's errors, and then nothing is
    unloaded."""
    if not config.scheduling_gate or components.driver_held(
            root, Layout.from_config(config, root), config):
        return
    from installer.cluster import scheduling_gate

    root.local(GPUS_READY_FILE).unlink(missing_ok=True)
    root.local(READY_FILE).unlink(missing_ok=True)
    scheduling_gate.close(config, why, drop_label=drop_label)
