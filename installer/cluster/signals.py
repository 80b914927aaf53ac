"""What a run tells the cluster about its node (NVIDIA_INSTALLER_CLUSTER_SIGNALS): the
NvidiaDriverReady condition (Unknown while a driver goes on, then True or False) and an Event
for each outcome. `app` loads this only with the signals on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from installer.config import Config
from installer.errors import InstallerError
from installer.hostroot import HostRoot

if TYPE_CHECKING:
    from installer.plan import StepOutcome, Target


class Told:
    """The signals on: the condition and the events of one run, each best effort."""

    def __init__(self, config: Config) -> None:
        from installer import components
        from installer.cluster import events

        self._config = config
        self._root = HostRoot(config.root)
        self._components = components.names()
        self._events = events.Poster(config)

    def started(self, target: Target) -> None:
        """Only when the driver is not verified and loaded (a warm run says nothing until its
        end, and then only when something changed)."""
        from installer.cluster import condition, events
        from installer.host import readiness

        if not readiness.driver_pending(self._root):
            return
        # dnf without cached metadata learns the stream's newest version only when it runs.
        version = f"R{target.branch} (its newest)" if target.version_pending else target.version
        self._events.post([events.started(version, target.flavour, target.kernel,
                                          target.source)])
        condition.report(self._config, condition.installing(version, target.source))

    def succeeded(self, steps: Sequence[StepOutcome], version: str, total: float) -> None:
        """The condition, then the verified driver's labels and annotations (one read of the
        Node for both: a warm run that finds both in place writes nothing)."""
        from installer.cluster import condition, driver_labels, events
        from installer.host import readiness

        self._events.post(events.outcomes(steps, version, total))
        node = condition.read_node(self._config)
        condition.report(self._config, condition.after_run(self._root, self._components, None),
                         node=node)
        verified = readiness.verified_version(self._root)
        if verified is not None:
            driver_labels.report(self._config, verified, node)

    def failed(self, error: InstallerError) -> None:
        from installer.cluster import condition, events

        self._events.post([events.failed(error)])
        condition.report(self._config, condition.after_run(self._root, self._components,
                                                           error))
