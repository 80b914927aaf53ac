"""Events on the node for what a run did (started, modules compiled, pulled or reused,
installed, verified, failed, next kernel prepared) and for what `installer gate` sees change
(the driver or a daemon going down and coming back): `kubectl get events` tells an operator the
story without a pod log. Posting is best effort: a refused or lost event never fails a run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from installer.cluster.client import NodeClient, for_node
from installer.config import Config
from installer.errors import InstallerError

if TYPE_CHECKING:
    from installer.plan import StepOutcome

log = logging.getLogger(__name__)

ClientFactory = Callable[[Config], NodeClient]


class Event(NamedTuple):
    reason: str
    message: str
    warning: bool = False
    action: str = ""



class Poster:
    """Posts Events about one node; reads the node once for its uid (involvedObject.uid)."""

    def __init__(self, config: Config, client: ClientFactory = for_node) -> None:
        self._config = config
        self._client = client
        self._api: NodeClient | None = None
        self._uid: str | None = None

    def post(self, events: Sequence[Event]) -> None:
        """Post each event; a failure is logged (once per call), never raised."""
        if not events:
            return
        try:
            if self._api is None:
                self._api = self._client(self._config)
            if self._uid is None:
                self._uid = str(self._api.get_node()["metadata"].get("uid", ""))
        except InstallerError as error:
            log.warning("could not post %d event(s) on node %s: %s", len(events),
                        self._config.node_name, error.message)
            return
        for event in events:
            self._api.event(self._uid, event.reason, event.message, warning=event.warning,
                            action=event.action)


def started(version: str, flavour: str, kernel: str, source: str) -> Event:
    return Event("DriverInstallStarted", f"installing NVIDIA driver {version} ({flavour}) for "
                 f"kernel {kernel} from {source}", action="Install")


def outcomes(steps: Sequence[StepOutcome], version: str, total: float) -> list[Event]:
    """The events of a successful run, from what its steps did (nothing for a run that found
    every step satisfied: a pod restart on an installed node is no news)."""
    done = {s.name: s for s in steps if s.status == "applied"}
    found: list[Event] = []
    if "build-modules" in done:
        found.append(Event("DriverModulesCompiled", f"kernel modules of driver {version} "
                           f"compiled in {done['build-modules'].seconds:.1f} s",
                           action="Build"))
    elif "use-prebuilt-modules" in done:
        found.append(Event("DriverModulesPulled", f"prebuilt kernel modules of driver "
                           f"{version} pulled and verified in "
                           f"{done['use-prebuilt-modules'].seconds:.1f} s", action="Pull"))
    elif "install-module-files" in done:
        found.append(Event("DriverModulesReused", f"kernel modules of driver {version} "
                           "reused from the node's cache", action="Install"))
    if "load-modules" in done or "install-userspace" in done:
        phases = ", ".join(f"{s.name} {s.seconds:.1f} s" for s in steps
                           if s.status == "applied" and s.seconds >= 0.05)
        found.append(Event("DriverInstalled", f"driver {version} installed in {total:.1f} s"
                           + (f" ({phases})" if phases else ""), action="Install"))
    if "verify-driver" in done:
        found.append(Event("DriverVerified", f"driver {version} verified in "
                           f"{done['verify-driver'].seconds:.1f} s", action="Verify"))
    if "prepare-next-kernel" in done:
        found.append(Event("NextKernelPrepared", f"modules of driver {version} prepared for "
                           "the kernel the node boots next in "
                           f"{done['prepare-next-kernel'].seconds:.1f} s", action="Build"))
    return found


def failed(error: InstallerError) -> Event:
    return Event("DriverInstallFailed", f"error[{error.reference}]: {error.message}"
                 + (f" Hint: {error.hint}" if error.hint else ""), warning=True,
                 action="Install")


def changes(before: Sequence[str], now: Sequence[str]) -> list[Event]:
    """What `installer gate` tells as the node's readiness moves: each reason it is not ready
    that appeared (a daemon down, given up on or restarting; the driver gone) and the node
    becoming ready again."""
    found = [Event("NodeNotReadyForGpus", why, warning=True, action="Watch")
             for why in now if why not in before]
    if before and not now:
        found.append(Event("NodeReadyForGpus", "the driver and what it needs are up",
                           action="Watch"))
    return found
