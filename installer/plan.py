"""A pure plan: host facts, each decision with its reason, and the named steps `run` takes."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from installer.config import Config
from installer.host import HostFacts
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.runner import Runner

if TYPE_CHECKING:
    from installer.errors import InstallerError


class Headers(NamedTuple):
    """A kernel's header trees as nvidia-installer needs them: the source tree (its
    `--kernel-source-path`) and the configured output tree (`--kernel-output-path`), which are
    one directory except on Debian (`-common` and `-amd64`). Also the trees that must be visible
    at their own absolute paths for kbuild to work (Debian's Makefile includes `-common` by
    absolute path), and why these paths were chosen."""

    output_path: PurePosixPath
    source_path: PurePosixPath
    binds: tuple[PurePosixPath, ...]
    in_container: bool = False
    # Where the trees lie here when they are not the host root's (headers unpacked into the
    # install dir's cache): `binds` are then taken from below this directory.
    unpacked_root: Path | None = None
    output_why: str = ""
    source_why: str = ""


class UpgradeGate(Protocol):
    """How a run gets past a loaded driver that processes hold."""

    # True once `preflight` has passed: staging may go ahead while the driver is held.
    cleared_to_stage: bool
    # True once `free_driver` has freed the driver in this run.
    freed: bool

    def preflight(self, ctx: Context, holders: Sequence[str]) -> None:
        """Before anything is staged on the host, the driver being held by `holders`: raise
        when the upgrade cannot go ahead, so the host stays as it was."""

    def free_driver(self, ctx: Context, holders: Sequence[str], old: str, new: str,
                    detail: str = "") -> None:
        """Right before the held driver `old` is unloaded (or replaced) for `new`: free it, or
        raise driver-in-use naming `holders` (and `detail`)."""

    def finished(self, config: Config, layout: Layout) -> None:
        """After the install steps succeeded."""

    def failed(self, config: Config, layout: Layout, error: InstallerError) -> None:
        """After an install step raised `error` (which is raised on; best effort)."""


class ShippedBy(enum.Enum):
    """Who puts a component's user space (Fabric Manager, NVLSM, IMEX) beside the driver's, as
    the source answers it (sources.Source.ships_user_space; Target.ships_user_space carries
    it)."""

    COMPONENT = "component"  # its own steps, from NVIDIA's redist archive of the driver's version
    SOURCE = "source"  # the source's own packages
    HOST = "host"  # nobody here: the host's own packages and services


def _shipped_by_component(component: str) -> ShippedBy:
    return ShippedBy.COMPONENT


class Decision(NamedTuple):
    topic: str
    value: str
    reason: str


class Step(NamedTuple):
    """One named step: `is_satisfied` only reads the host; `apply` changes it."""

    name: str
    summary: str
    is_satisfied: Callable[[], bool]
    apply: Callable[[], None]


class StepOutcome(NamedTuple):
    """What running a step did: the run's outcome record and its events read it."""

    name: str
    status: str  # "satisfied" or "applied"
    seconds: float


@dataclass
class Target:
    """What this run installs, decided once by the planner."""

    version: str
    branch: int
    flavour: str
    kernel: str
    source: str
    urls: list[str]
    headers: Headers | None
    load: bool
    gpu_addresses: tuple[str, ...]
    # dnf without cached module metadata installs the stream's newest, known only
    # when run; `version` is then a placeholder that plan and step summaries must not name.
    version_pending: bool = False
    # What the shared steps need of the source (sources.Source), set by the planner so that no
    # step tests the source's name: False when its package manager places the module files;
    # True when its install replaces the loaded driver's user space before the unload.
    stages_module_files: bool = True
    replaces_user_space_before_unload: bool = False
    # Who ships a component's user space, by the component's name: the chosen source's answer.
    ships_user_space: Callable[[str], ShippedBy] = _shipped_by_component


@dataclass
class Context:
    """Everything a step needs; steps keep no other state."""

    config: Config
    root: HostRoot
    layout: Layout
    runner: Runner
    facts: HostFacts
    target: Target
    fetch_runfile: Callable[[list[str], Path, str], Path]
    runfile: Path | None = None
    # Answers worth asking once per run and shared by the plan's decisions and its steps
    # (the registry lookup), keyed by who asks.
    memo: dict[str, Any] = field(default_factory=dict)
    # What frees a held driver for its unload (cluster/upgrade_gate.py), chosen by the planner.
    upgrade_gate: UpgradeGate | None = None


@dataclass
class Plan:
    context: Context
    decisions: list[Decision]
    steps: list[Step]
    blockers: list[str] = field(default_factory=list)
