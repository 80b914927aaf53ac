"""What every component answers (one object each, registered in `components.COMPONENTS`): the
planner asks its decision and steps, prune which downloads it keeps, the unload and uninstall
which daemon to stop, the container command which daemon to keep up."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from installer.components.supervisor import Daemon
    from installer.config import Config
    from installer.hostroot import HostRoot
    from installer.plan import Context, Decision, Step


class Component(Protocol):
    # Its container command (`installer <name>`) and readiness file: the scheduling gate waits
    # for each registered component's.
    name: str
    # The command's help (`installer <name> --help`).
    summary: str
    # The process it keeps up beside the driver (stopped before an unload or uninstall).
    daemon: str
    # Whether the scheduling gate and the node's condition wait for its container: False for
    # an opt-in one, whose container a DaemonSet may not have (its state is reported where
    # its container wrote one).
    awaited: bool

    def decision(self, ctx: Context) -> Decision:
        """What the plan says about it, with the reason."""

    def steps(self, ctx: Context) -> list[Step]:
        """Its steps, after the user space is in versions/<ver>/, before it is activated."""

    def keeps_download(self, name: str, version: str, arch: str) -> bool:
        """Whether the cached download `name` is its, of `version` (kept while installed)."""

    def supervised(self, config: Config, root: HostRoot) -> Daemon:
        """The daemon `installer <name>` keeps up (called once, in that container)."""
