"""The node's NvidiaDriverReady condition: set through nodes/status at the end of every run and
kept in step with the node's readiness by `installer gate`, so `kubectl describe node` (and a
readiness controller) sees whether the driver works without reading a pod log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from installer.cluster.client import Json, NodeClient, for_node
from installer.config import Config
from installer.errors import ClusterApiForbidden, InstallerError, NodeConditionForbidden
from installer.host import readiness
from installer.hostroot import HostRoot
from installer.layout import READY_FILE

log = logging.getLogger(__name__)

TYPE = "NvidiaDriverReady"
VERIFIED = "Verified"
# The API server validates a condition message of at most 32768 bytes; a page of text is
# more than `kubectl describe node` can show anyway.
MESSAGE_LIMIT = 1024

ClientFactory = Callable[[Config], NodeClient]


class Reading(NamedTuple):
    """What the condition says: status True/False/Unknown, a CamelCase reason, a message."""

    status: str
    reason: str
    message: str



def camel(reference: str) -> str:
    """An error reference as a condition reason: driver-in-use -> DriverInUse (the API
    server accepts only [A-Za-z0-9_,:] in a reason, starting with a letter)."""
    return "".join(part[:1].upper() + part[1:] for part in reference.split("-") if part)


def facts(root: HostRoot, components: Sequence[str]) -> str:
    """What this host says about its driver, from the readiness files: version, flavour,
    kernel, and each component (Fabric Manager, persistenced) up, idle or down, with the
    NVLink fabric's state where the fabricmanager container reported it; an opt-in component
    (IMEX) only where its container wrote its file."""
    from installer.components import optional

    driver = _values(root.read_text(READY_FILE))
    parts = []
    if driver.get("DRIVER_VERSION"):
        parts.append(f"driver {driver['DRIVER_VERSION']}"
                     + (f" ({driver['KERNEL_MODULE_TYPE']})"
                        if driver.get("KERNEL_MODULE_TYPE") else ""))
    if driver.get("KERNEL_RELEASE"):
        parts.append(f"kernel {driver['KERNEL_RELEASE']}")
    reported = [name for name in optional() if name not in components
                and root.exists(readiness.component_file(name))]
    for name in (*components, *reported):
        text = root.read_text(readiness.component_file(name))
        state = _values(text)
        if text is None:
            parts.append(f"{name}: down")
        elif state.get("STATE") == "not-applicable":
            parts.append(f"{name}: not needed")
        elif state.get("FABRIC"):  # the GPUs' NVLink fabric states, as NVML last said them
            parts.append(f"{name}: up (fabric {state['FABRIC']})")
        elif state.get("IMEX"):  # what nvidia-imex-ctl -q said
            parts.append(f"{name}: up ({state['IMEX']})")
        else:
            parts.append(f"{name}: up")
    return ", ".join(parts)


def observe(root: HostRoot, components: Sequence[str]) -> Reading:
    """The condition the node's readiness calls for now (what `installer gate` keeps)."""
    waiting = readiness.driver_pending(root)
    reason = "DriverNotReady"
    if not waiting:
        version = readiness.verified_version(root)
        waiting = readiness.components_pending(root, version or "", components)
        reason = "ComponentsNotReady"
    about = facts(root, components)
    if not waiting:
        return Reading("True", VERIFIED, about)
    return Reading("False", reason, "; ".join(waiting) + (f" [{about}]" if about else ""))


def after_run(root: HostRoot, components: Sequence[str],
              error: InstallerError | None) -> Reading:
    """The condition a run leaves: its error (reason: the reference in CamelCase, message: what
    failed and the hint), else what the node's readiness says."""
    if error is None:
        return observe(root, components)
    message = error.message + (f" Hint: {error.hint}" if error.hint else "")
    return Reading("False", camel(error.reference), message)


def installing(version: str, source: str) -> Reading:
    return Reading("Unknown", "Installing", f"installing driver {version} from {source}")


def set_condition(config: Config, reading: Reading, client: ClientFactory = for_node,
                  node: Json | None = None) -> bool:
    """Give the node `reading` as its NvidiaDriverReady condition through nodes/status
    (lastTransitionTime moves only when the status does; `node`: the Node as just read, to
    spare a read). Writes nothing when the node already says the same. Returns whether it
    wrote. Raises NodeConditionForbidden on a refusal (RBAC, policy), ClusterApiUnavailable,
    NodeNotFound."""
    api = client(config)
    try:
        if node is None:
            node = api.get_node()
        old = current(node)
        if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == \
                tuple(reading):
            return False
        now = _now()
        transition = now if old is None or old.get("status") != reading.status else \
            old.get("lastTransitionTime", now)
        api.patch_status({"status": {"conditions": [{
            "type": TYPE, "status": reading.status, "reason": reading.reason,
            "message": reading.message[:MESSAGE_LIMIT], "lastHeartbeatTime": now,
            "lastTransitionTime": transition}]}})
    except ClusterApiForbidden as error:
        raise NodeConditionForbidden(f"node condition {TYPE}: {error.message}") from error
    log.info("node %s: condition %s=%s (%s: %s)", api.node, TYPE, reading.status,
             reading.reason, reading.message)
    return True


def read_node(config: Config, client: ClientFactory = for_node) -> Json | None:
    """The Node, or None when it cannot be read now (each write reads it again and says what
    failed)."""
    try:
        return client(config).get_node()
    except InstallerError:
        return None


def current(node: Json) -> Json | None:
    """The node's NvidiaDriverReady condition as the API server holds it, or None."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == TYPE:
            return condition
    return None


def report(config: Config, reading: Reading, client: ClientFactory = for_node,
           node: Json | None = None) -> None:
    """set_condition for a run: a failure is a warning (the driver is what the run is for;
    `installer gate` writes the condition again)."""
    try:
        set_condition(config, reading, client, node)
    except InstallerError as error:
        log.warning("could not set the %s condition of node %s: %s", TYPE, config.node_name,
                    error.message)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _values(text: str | None) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (text or "").splitlines() if "=" in line)
