"""The protocol every source implements: what the planner, the shared steps, `status`,
`uninstall` and the next kernel ask of the way a driver reaches the host."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from installer.config import Config
from installer.errors import ConfigError
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.plan import Context, Decision, ShippedBy, Step
from installer.runner import Runner

if TYPE_CHECKING:
    from installer.host import Distro, HostFacts
    from installer.plan import Headers
    from installer.release import catalog as release_catalog


class Groundwork(NamedTuple):
    """What the planner knows when it asks a source for its first decisions."""

    config: Config
    root: HostRoot
    layout: Layout
    runner: Runner
    facts: HostFacts
    version: str
    catalog: release_catalog.Catalog
    running: str


@dataclass
class Arrival:
    """A source's first decisions, and the download URLs and headers the target carries."""

    decisions: list[Decision]
    urls: list[str] = field(default_factory=list)
    headers: Headers | None = None


class ManagedElsewhere(NamedTuple):
    """The next kernel's modules when the host's own tools put them there, not the installer."""

    why: str
    where: str
    present: bool


class Source:
    """One way a driver reaches the host. Subclasses answer for themselves; nothing outside
    `sources/` tests a source's name."""

    name: ClassVar[str]
    # The distro package source it needs (`distros.Family.package_sources`); None: any host.
    package_source: ClassVar[str | None] = None
    # False: its package manager places the module files (no install-module-files, firmware).
    stages_module_files: ClassVar[bool] = True
    # True: its own steps free the driver before they change anything (no driver-free step).
    frees_driver_itself: ClassVar[bool] = False
    # True: its install replaces the loaded driver's user space before the unload.
    replaces_user_space_before_unload: ClassVar[bool] = False
    # True: it builds modules into the install dir's cache, for any kernel (prebuild, the next
    # kernel); the sources that cannot are given this one's name for such builds.
    builds_modules: ClassVar[bool] = False

    def offered(self, distro: Distro) -> bool:
        from installer import distros

        return self.package_source is None or (
            self.package_source in distros.of(distro).package_sources)

    def refuse_unless_offered(self, distro: Distro) -> None:
        """Raise ConfigError when it was asked for by name on a host that cannot have it."""
        if not self.offered(distro):
            raise ConfigError(f"NVIDIA_DRIVER_SOURCE={self.name} is not offered on {distro}")

    def evidence(self, root: HostRoot, config: Config) -> str | None:
        """Why `auto` chooses it on this host, or None. Reads only."""
        return None

    def passed_over(self) -> str:
        """Why `auto` did not choose it, in words, for the reason of the source chosen."""
        return f"no evidence for {self.name}"

    def reason(self, config: Config, facts: HostFacts, passed_over: Sequence[str]) -> str:
        """The source decision's reason, once it is chosen; `passed_over` says why `auto` passed
        over each other source offered on this host (the registry's `passed_over`)."""
        raise NotImplementedError

    def arrival(self, ground: Groundwork) -> Arrival:
        """Its decisions before the target is settled, and the URLs and headers it needs."""
        raise NotImplementedError

    def decisions(self, ctx: Context, decided: list[Decision]) -> list[Decision]:
        """The plan's decisions once the target is known: `decided` with its own added or
        put in place of those it settles itself."""
        return decided

    def steps(self, ctx: Context) -> list[Step]:
        """Its steps, between the guards and the shared staging steps."""
        raise NotImplementedError

    def ships_user_space(self, component: str, distro: Distro) -> ShippedBy:
        """Who puts `component`'s user space (fabricmanager, nvlsm, imex) beside the driver's on
        `distro`: by default the component itself, from NVIDIA's redist archive of the
        driver's version into versions/<ver>/."""
        return ShippedBy.COMPONENT

    def next_kernel_elsewhere(self, root: HostRoot, kernel: str) -> ManagedElsewhere | None:
        """The next kernel's modules when the host's tools, not the installer, put them there."""
        return None

    def left_on_host(self) -> str | None:
        """What `uninstall` leaves on the host because the source's own tool owns it."""
        return None
