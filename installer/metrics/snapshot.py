"""What the metrics say, read from the files the installer and its containers write (no NVML
on a scrape: the GPUs' fabric state and persistence mode are asked at most once a minute)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from installer import outcome, state
from installer.components import names as component_names
from installer.components import supervisor
from installer.config import Config
from installer.host import readiness
from installer.hostroot import HostRoot
from installer.layout import READY_FILE, Layout

log = logging.getLogger(__name__)

# A GPU as the metrics need it: its PCI address, UUID, fabric state, fabric status, persistence,
# and whether its fabric is done (GpuInfo.fabric_done: completed, success, not unhealthy).
GpuState = tuple[str, str, Optional[str], Optional[str], Optional[str], bool]
GpuReader = Callable[[], Sequence[GpuState]]


@dataclass(frozen=True)
class Snapshot:
    """One scrape's worth of facts about this node."""

    driver_ready: bool
    node_ready: bool
    installed: Optional[state.InstallRecord]
    last_run: dict[str, Any]
    daemons: dict[str, dict[str, str]]  # component -> its readiness file's values (or {})
    restarts: dict[str, int]
    fabric_required: bool
    gpus: tuple[GpuState, ...]
    next_kernel: dict[str, Any] = field(default_factory=dict)
    # Each record read (state, last-run, driver-ready, <component>-ready, <component>-restarts)
    # -> what is malformed in it, "" when it is well-formed or absent.
    records: dict[str, str] = field(default_factory=dict)

    @property
    def records_valid(self) -> bool:
        return not any(self.records.values())


class CachedGpus:
    """The GPUs' NVML answers, asked again only after `interval` seconds (a child process with
    the driver's libraries each time), and only while the driver is verified and loaded."""

    def __init__(self, ask: GpuReader, interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ask, self.interval, self.clock = ask, interval, clock
        self.asked_at: Optional[float] = None
        self.gpus: tuple[GpuState, ...] = ()
        self.lock = threading.Lock()

    def get(self, driver_ready: bool) -> tuple[GpuState, ...]:
        with self.lock:
            if not driver_ready:
                self.asked_at, self.gpus = None, ()
                return ()
            now = self.clock()
            if self.asked_at is None or now - self.asked_at >= self.interval:
                self.gpus, self.asked_at = tuple(self.ask()), now
            return self.gpus


def nvml_reader(layout: Layout, runner: Any) -> GpuReader:
    """Ask NVML through the verify child (the only room that loads it)."""

    def ask() -> Sequence[GpuState]:
        from installer import verify

        gpus, _problems = verify.nvml_gpus(layout.install_local, runner)
        return [(g.pci_bus_id, g.uuid, g.fabric_state, g.fabric_status, g.persistence_mode,
                 g.fabric_done) for g in gpus]

    return ask


def take(config: Config, root: HostRoot, layout: Layout, gpus: CachedGpus) -> Snapshot:
    """Read the node's files once. Read-only; raises nothing a host can cause: a missing file
    reads as absent, a malformed one as absent too and named in `records`."""
    from installer import components, nextkernel

    names = component_names()
    driver_ready = not readiness.driver_pending(root)
    node_ready = driver_ready and not readiness.pending(root, names)
    # An opt-in component (IMEX) is a series only where its container has said something.
    names += tuple(name for name in components.optional()
                   if root.exists(readiness.component_file(name))
                   or root.exists(supervisor.restarts_file(name)))
    record = state.read_record(layout.state_file)
    records = record_problems(root, layout, names)
    for key, problem in records.items():
        if problem:
            log.warning("metrics: the %s record is malformed: %s", key, problem)
    fabric_required, _switches = components.fabric_required(root)
    try:
        upcoming = nextkernel.status(config, root, layout, record)
    except Exception as exc:  # the other metrics still answer
        log.warning("metrics: the next kernel's state is unknown: %s", exc)
        upcoming = {}
    return Snapshot(
        driver_ready=driver_ready,
        node_ready=node_ready,
        installed=record,
        last_run=outcome.read(outcome.outcome_path(layout.install_local)) or {},
        daemons={name: _values(root.read_text(readiness.component_file(name)))
                 for name in names},
        restarts={name: supervisor.read_restarts(root, name) for name in names},
        fabric_required=fabric_required,
        gpus=gpus.get(driver_ready),
        next_kernel=upcoming,
        records=records,
    )


def record_problems(root: HostRoot, layout: Layout, names: Sequence[str]) -> dict[str, str]:
    """Each record the installer and its containers keep on the node (state, last-run,
    driver-ready, and <name>-ready, <name>-restarts for each component) -> what is malformed
    in it, "" when it is well-formed or absent. Read-only; raises nothing."""
    problems = {"state": state.load_record(layout.state_file)[1],
                "last-run": outcome.load(outcome.outcome_path(layout.install_local))[1],
                "driver-ready": _readiness_problem(root.read_text(READY_FILE))}
    for name in names:
        problems[f"{name}-ready"] = _readiness_problem(
            root.read_text(readiness.component_file(name)))
        count = (root.read_text(supervisor.restarts_file(name)) or "").strip()
        problems[f"{name}-restarts"] = "" if supervisor.restarts_valid(count) else "not a count"
    return problems


def _readiness_problem(text: str | None) -> str:
    """A readiness file is absent (nothing reported yet) or names the driver it is for."""
    if text is None or _values(text).get("DRIVER_VERSION"):
        return ""
    return "names no DRIVER_VERSION"


def _values(text: str | None) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (text or "").splitlines() if "=" in line)
