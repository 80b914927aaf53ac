"""What every component answers (one object each, registered in `components.COMPONENTS`): the
planner asks its decision, its steps beside the user space and its steps after the driver is
loaded, prune which downloads it keeps, the unload and uninstall which daemon to stop, the
container command which daemon to keep up, `installer verify` what it adds to the report, what
problems it finds and why the fabric is not complete. `Part` answers "nothing" to each, so a
component says only what it has."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from installer.components.supervisor import Daemon
    from installer.config import Config
    from installer.hostroot import HostRoot
    from installer.plan import Context, Decision, Step
    from installer.verify import GpuInfo


class Component(Protocol):
    # Read-only: a class attribute answers each (`daemon = "nv-fabricmanager"`).
    # Who it is; for one with a container command (`command`), that command (`installer
    # <name>`) and its readiness file.
    @property
    def name(self) -> str: ...

    # The command's help (`installer <name> --help`).
    @property
    def summary(self) -> str: ...

    # Whether it has a container command of its own (`installer <name>`).
    @property
    def command(self) -> bool: ...

    # The process it keeps up beside the driver (stopped before an unload or uninstall); None
    # for one without a daemon.
    @property
    def daemon(self) -> Optional[str]: ...

    # Where its daemon is stopped and its fabric reasons are said, among the others: 0, or 1
    # for one that runs behind another's daemon (NVLSM behind nv-fabricmanager) and so stops
    # after it. Equal places keep the order of COMPONENTS.
    @property
    def stop_order(self) -> int: ...

    # Whether the scheduling gate and the node's condition wait for its container: False for
    # an opt-in one, whose container a DaemonSet may not have (its state is reported where
    # its container wrote one). Only a component with a command is waited for.
    @property
    def awaited(self) -> bool: ...

    def decision(self, ctx: Context) -> Decision | None:
        """What the plan says about it, with the reason (None: it says nothing)."""

    def steps(self, ctx: Context) -> list[Step]:
        """Its steps, after the user space is in versions/<ver>/, before it is activated."""

    def loaded_steps(self, ctx: Context) -> list[Step]:
        """Its steps once the driver's modules are loaded, before the device nodes and the
        driver's verification (run only where the plan loads the driver)."""

    def keeps_download(self, name: str, version: str, arch: str) -> bool:
        """Whether the cached download `name` is its, of `version` (kept while installed)."""

    def supervised(self, config: Config, root: HostRoot) -> Daemon:
        """The daemon `installer <name>` keeps up (called once, in that container)."""

    def fabric_reasons(self, root: HostRoot, gpus: Sequence[GpuInfo]) -> list[str]:
        """Why the NVLink fabric of `gpus` is not complete, as far as it is concerned (a phrase
        each; read-only)."""

    def verify_section(self, config: Config, root: HostRoot) -> dict[str, object]:
        """What it adds to `installer verify --json` (read-only): {} for nothing."""

    def verify_problems(self, config: Config, root: HostRoot) -> list[str]:
        """What `installer verify` counts against the node as far as it is concerned (a
        sentence each; read-only): [] for nothing."""


class Part:
    """A component that has nothing of each part: a module's component class says only what it
    has (its decision, steps, daemon, command, ...)."""

    name = ""
    summary = ""
    command = False
    daemon: Optional[str] = None
    stop_order = 0
    awaited = False

    def decision(self, ctx: Context) -> Decision | None:
        return None

    def steps(self, ctx: Context) -> list[Step]:
        return []

    def loaded_steps(self, ctx: Context) -> list[Step]:
        return []

    def keeps_download(self, name: str, version: str, arch: str) -> bool:
        return False

    def supervised(self, config: Config, root: HostRoot) -> Daemon:
        raise KeyError(f"{self.name} has no daemon to keep up")

    def fabric_reasons(self, root: HostRoot, gpus: Sequence[GpuInfo]) -> list[str]:
        return []

    def verify_section(self, config: Config, root: HostRoot) -> dict[str, object]:
        return {}

    def verify_problems(self, config: Config, root: HostRoot) -> list[str]:
        return []
