"""A pure plan: host facts, each decision with its reason, and the named steps `run` takes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from installer.config import Config
from installer.host import HostFacts
from installer.hostroot import HostRoot
from installer.kernel import Headers
from installer.layout import Layout
from installer.runner import Runner

if TYPE_CHECKING:
    from installer.upgrade_gate import UpgradeGate


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
    # True when the distro's packages own the user space (and so Fabric Manager's files too).
    packages_own_user_space: bool = False


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
    # What frees a held driver for its unload (upgrade_gate.py), chosen by the planner.
    upgrade_gate: UpgradeGate | None = None


@dataclass
class Plan:
    context: Context
    decisions: list[Decision]
    steps: list[Step]
    blockers: list[str] = field(default_factory=list)
