"""The scheduling gate on this node: a NoSchedule taint (NVIDIA_INSTALLER_GATE_TAINT) keeps pods
away until the driver is verified and what it needs is up, and goes back on before a driver is
unloaded; a label names the verified driver version. Each patch carries the node's
resourceVersion and the taint list as it was read with only the gate's taint added or taken
out, so an admin's taints and labels are never touched (a 409 means: read again).

`serve` is `installer gate`, the long-running container that opens the gate once the node is
ready and (NVIDIA_INSTALLER_GATE_CLOSE_AFTER) closes it again when it stays not ready."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from installer.cluster.client import Conflict, Json, NodeClient, for_node
from installer.config import Config
from installer.errors import (
    ClusterApiForbidden,
    ClusterApiUnavailable,
    SchedulingGateForbidden,
    SchedulingGateUnavailable,
)
from installer.host import readiness
from installer.hostroot import HostRoot

log = logging.getLogger(__name__)

# The installer's own label, beside nvidia-driver-installer/upgrade-state: the version it
# verified on this node (GPU Feature Discovery's nvidia.com/cuda.driver-version.* is NVML's view,
# written by NFD; docs/deploy.md says why the two are kept apart).
VERSION_LABEL = "nvidia-driver-installer/driver-version"
EFFECT = "NoSchedule"
CONFLICT_RETRIES = 8
POLL_SECONDS = 5.0
# `serve` confirms the node's state with the API server this often even when nothing changed
# here (a node object re-registered with its startup taints, a taint put on by hand).
RECHECK_SECONDS = 300.0

ClientFactory = Callable[[Config], NodeClient]
_KEEP = object()



def is_gate_taint(taint: Json, key: str) -> bool:
    """The gate's taint: its key with effect NoSchedule, whatever the value (a node pool may
    register it as key=true:NoSchedule)."""
    return taint.get("key") == key and taint.get("effect") == EFFECT


def close(config: Config, why: str, *, drop_label: bool = False,
          client: ClientFactory = for_node) -> bool:
    """Put the gate's taint on the node (when it is not on already); with `drop_label` also
    remove the version label (the driver goes away). Returns whether the node was written.
    Raises SchedulingGateUnavailable, SchedulingGateForbidden, NodeNotFound."""
    changed = _converge(config, client, tainted=True,
                        label=None if drop_label else _KEEP)
    if changed:
        log.info("scheduling gate closed: node %s tainted %s:%s (%s)", config.node_name,
                 config.gate_taint, EFFECT, why)
    return changed


def open_for(config: Config, version: str, client: ClientFactory = for_node) -> bool:
    """Take the gate's taint off the node and label it with `version`. Call only when
    readiness.pending(...) is empty. Returns whether the node was written. Raises as `close`."""
    changed = _converge(config, client, tainted=False, label=version)
    if changed:
        log.info("scheduling gate opened: node %s untainted (%s), %s=%s", config.node_name,
                 config.gate_taint, VERSION_LABEL, version)
    return changed


def _converge(config: Config, client: ClientFactory, *, tainted: bool, label: Any) -> bool:
    key = config.gate_taint
    with _gate_errors():
        api = client(config)
        for _ in range(CONFLICT_RETRIES):
            node = api.get_node()
            patch = _patch(node, key, tainted, label)
            if patch is None:
                return False
            try:
                api.patch_node(patch)
                return True
            except Conflict:
                continue
        raise ClusterApiUnavailable(f"node {api.node} kept changing while its scheduling gate "
                                    f"was set ({CONFLICT_RETRIES} conflicts)")


def _patch(node: Json, key: str, tainted: bool, label: Any) -> Json | None:
    """The merge patch that gives `node` the gate's state, or None when it has it. The taint
    list is replaced whole (merge patches cannot edit a list), so the patch is guarded by the
    resourceVersion it was computed from."""
    meta, spec = node["metadata"], node.get("spec") or {}
    taints = list(spec.get("taints") or [])
    ours = [t for t in taints if is_gate_taint(t, key)]
    patch: Json = {}
    if tainted and not ours:
        taints.append({"key": key, "effect": EFFECT})
        patch["spec"] = {"taints": taints}
    elif not tainted and ours:
        rest = [t for t in taints if not is_gate_taint(t, key)]
        patch["spec"] = {"taints": rest or None}
    labels = meta.get("labels") or {}
    if label is not _KEEP and labels.get(VERSION_LABEL) != label:
        patch["metadata"] = {"labels": {VERSION_LABEL: label}}
    if not patch:
        return None
    patch.setdefault("metadata", {})["resourceVersion"] = meta["resourceVersion"]
    return patch


@contextmanager
def _gate_errors() -> Iterator[None]:
    """The API's failures as the gate's own errors (the hint says the node keeps its taint)."""
    try:
        yield
    except (SchedulingGateUnavailable, SchedulingGateForbidden):
        raise
    except ClusterApiForbidden as error:
        raise SchedulingGateForbidden(f"scheduling gate: {error.message}") from error
    except ClusterApiUnavailable as error:
        raise SchedulingGateUnavailable(f"scheduling gate: {error.message}") from error


def serve(config: Config, components: Sequence[str], stop: threading.Event | None = None,
          client: ClientFactory = for_node,
          clock: Callable[[], float] = time.monotonic) -> None:
    """`installer gate`: until SIGTERM/SIGINT (or `stop`), open the gate once the node is
    ready (the driver and each of `components` up: readiness.pending); with
    NVIDIA_INSTALLER_GATE_CLOSE_AFTER > 0, close it again when the node stays not ready that
    long (Fabric Manager given up on, the driver unloaded by hand). An unreachable API server
    is retried; a refusal (RBAC, policy) or an unknown node ends it with its error.
    It never closes the gate on its own exit: a pod going away is not a broken node."""
    if stop is None:
        stop = _stop_on_signals()
    root = HostRoot(config.root)
    state: str | None = None  # "open <version>" or "closed", as last written or confirmed
    confirmed = clock()
    down_since: float | None = None
    said = ""
    keeper = _keeper(config, root, components, clock)
    while not stop.is_set():
        now = clock()
        if now - confirmed >= RECHECK_SECONDS:
            state, confirmed = None, now
        waiting = readiness.pending(root, components)
        if keeper is not None:
            keeper.keep(waiting)
        if not config.scheduling_gate:
            said = _say(said, f"node {config.node_name}: " + ("; ".join(waiting) or "ready"))
            stop.wait(POLL_SECONDS)
            continue
        try:
            if not waiting:
                down_since = None
                version = readiness.verified_version(root)
                if version and state != f"open {version}":
                    open_for(config, version, client)
                    state, confirmed = f"open {version}", now
                    said = _say(said, f"node {config.node_name} is ready (driver {version}): "
                                "the scheduling gate is open")
            else:
                down_since = now if down_since is None else down_since
                said = _say(said, f"node {config.node_name} is not ready: "
                            + "; ".join(waiting))
                if (config.gate_close_after > 0 and state != "closed"
                        and now - down_since >= config.gate_close_after):
                    close(config, "not ready for "
                          f"{config.gate_close_after:g} s: " + "; ".join(waiting),
                          client=client)
                    state, confirmed = "closed", now
        except SchedulingGateUnavailable as error:
            log.warning("%s (retrying in %g s)", error.message, POLL_SECONDS)
        stop.wait(POLL_SECONDS)


def _keeper(config: Config, root: HostRoot, components: Sequence[str],
            clock: Callable[[], float]) -> Any:
    """The NvidiaDriverReady condition and the readiness events, kept beside the gate with
    NVIDIA_INSTALLER_CLUSTER_SIGNALS (installer/cluster/keeper.py)."""
    if not config.cluster_signals:
        return None
    from installer.cluster.keeper import Keeper

    return Keeper(config, root, components, clock)


def _say(said: str, message: str) -> str:
    if message != said:
        log.info("%s", message)
    return message


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("scheduling gate: signal %d: stopping (the node's gate is left as it is)",
                 signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
