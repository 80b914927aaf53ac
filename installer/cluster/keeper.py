"""`installer gate` with NVIDIA_INSTALLER_CLUSTER_SIGNALS: the node's NvidiaDriverReady
condition kept in step with its readiness (a daemon given up on, the driver unloaded by hand,
all of it up again), and an Event each time that changes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from installer.cluster import condition, events
from installer.cluster.client import for_node
from installer.config import Config
from installer.errors import ClusterApiUnavailable, NodeNotFound
from installer.hostroot import HostRoot

log = logging.getLogger(__name__)

# The condition is confirmed with the API server this often even when nothing changed here
# (someone or something removed it; a node object registered anew).
RECHECK_SECONDS = 300.0


class Keeper:
    def __init__(self, config: Config, root: HostRoot, components: Sequence[str],
                 clock: Callable[[], float],
                 client: condition.ClientFactory = for_node) -> None:
        self._config, self._root, self._components = config, root, tuple(components)
        self._clock, self._client = clock, client
        self._written: condition.Reading | None = None
        self._confirmed = clock()
        self._waiting: list[str] = []
        self._events = events.Poster(config, client)

    def keep(self, waiting: Sequence[str]) -> None:
        """One look: post the events of what changed, write the condition when it differs
        from what was last written (or RECHECK_SECONDS passed). An unreachable API server is
        retried on the next look. Raises NodeConditionForbidden (the container then ends
        with its error: a refusal does not mend itself)."""
        self._events.post(events.changes(self._waiting, waiting))
        self._waiting = list(waiting)
        reading = condition.observe(self._root, self._components)
        now = self._clock()
        if reading == self._written and now - self._confirmed < RECHECK_SECONDS:
            return
        try:
            condition.set_condition(self._config, reading, self._client)
        except (ClusterApiUnavailable, NodeNotFound) as error:
            log.warning("could not set the %s condition: %s (retrying)", condition.TYPE,
                        error.message)
            return
        self._written, self._confirmed = reading, now
