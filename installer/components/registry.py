"""The registered components and what the plan and the container commands ask of them all."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from installer.components import (
    fabric,
    fabricmanager,
    gpudirect,
    imex,
    imexd,
    nvlink5,
    nvlsm,
    nvswitch,
    persistenced,
)
from installer.config import Config
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.plan import Context, Decision, Step

if TYPE_CHECKING:  # the protocol is for the type checker; the tuple is what runs
    from collections.abc import Sequence

    from installer.components.component import Component
    from installer.verify import GpuInfo

log = logging.getLogger(__name__)

# Every component, in plan order (decisions, then steps): a new one is its module (a
# `Component`, most simply a `component.Part`) and a line here. Its daemon is stopped, and its
# fabric reasons said, in `stop_order` (then this order): NVLSM, which the fabricmanager
# container runs behind nv-fabricmanager, after the others.
COMPONENTS: tuple[Component, ...] = (
    gpudirect.COMPONENT,  # nvidia-peermem after the driver's modules, where asked for
    nvlink5.COMPONENT,  # why Fabric Manager applies there and what NVLSM needs: said first
    nvlsm.COMPONENT,  # its InfiniBand modules' step above stops the run before any download
    imex.COMPONENT,
    fabricmanager.COMPONENT,
    persistenced.COMPONENT,
    imexd.COMPONENT,
)


def _in_stop_order() -> list[Component]:
    return sorted(COMPONENTS, key=lambda c: c.stop_order)  # stable: equal places keep order


def fabric_diagnoses() -> tuple[fabric.Diagnosis, ...]:
    """Why a fabric is not complete: each entry says it of the GPUs NVML reported, a phrase
    each (`fabric.Diagnosis`); `installer verify` and the fabricmanager container's error name
    them. The components' in stop order, then the fabric's own (a shared-NVSwitch partition)."""
    return (*(c.fabric_reasons for c in _in_stop_order()), fabric.partition_reasons)


def fabric_diagnosis(root: HostRoot, gpus: Sequence[GpuInfo]) -> list[str]:
    """Every registered diagnosis's reasons why the fabric of `gpus` is not complete."""
    return [reason for diagnose in fabric_diagnoses() for reason in diagnose(root, gpus)]


def _commanded() -> list[Component]:
    return [c for c in COMPONENTS if c.command]


def named(name: str) -> Component:
    """The registered component `name` with a container command (`installer <name>`). Raises
    KeyError for another."""
    for component in _commanded():
        if component.name == name:
            return component
    raise KeyError(name)


def names() -> tuple[str, ...]:
    """The readiness files the scheduling gate and the node's condition wait for beside the
    driver's: those of every component with a container command but the opt-in ones."""
    return tuple(c.name for c in _commanded() if c.awaited)


def optional() -> tuple[str, ...]:
    """The opt-in components: reported where their container wrote a readiness file, never
    waited for."""
    return tuple(c.name for c in _commanded() if not c.awaited)


def commands() -> tuple[str, ...]:
    """Every component's container command (`installer <name>`) and readiness file."""
    return tuple(c.name for c in _commanded())


def daemons() -> tuple[str, ...]:
    """The names of their daemons' processes (what an unload waits for or stops), in the order
    they are stopped."""
    return tuple(c.daemon for c in _in_stop_order() if c.daemon is not None)


def decisions(ctx: Context) -> list[Decision]:
    said = (component.decision(ctx) for component in COMPONENTS)
    return [decision for decision in said if decision is not None]


def steps(ctx: Context) -> list[Step]:
    """After the user space is in versions/<ver>/, before it is activated."""
    return [step for component in COMPONENTS for step in component.steps(ctx)]


def loaded_steps(ctx: Context) -> list[Step]:
    """Once the driver's modules are loaded, before its device nodes and verification."""
    return [step for component in COMPONENTS for step in component.loaded_steps(ctx)]


def keeps_download(name: str, version: str, arch: str) -> bool:
    """A cached download of a component of `version` (kept while that version is installed)."""
    return any(component.keeps_download(name, version, arch) for component in COMPONENTS)


def fabric_required(root: HostRoot) -> tuple[bool, tuple[str, ...]]:
    """Whether readiness needs the NVLink fabric (an NVSwitch or NVLink5 node whose fabric the
    node manages), and the switches: the driver's list, else the PCI functions (none listed on
    an NVLink5 node, whose switches are behind its LPF ports)."""
    fabric = nvlink5.fabric_now(root)
    switches = nvswitch.driver_switches(root) or tuple(s.address for s in fabric.switches)
    return fabric.needed, switches


def verify_sections(config: Config, root: HostRoot) -> dict[str, object]:
    """What the components add to `installer verify --json` (read-only)."""
    sections: dict[str, object] = {}
    for component in COMPONENTS:
        sections.update(component.verify_section(config, root))
    return sections


def verify_problems(config: Config, root: HostRoot) -> list[str]:
    """What the components count against the node in `installer verify` (read-only)."""
    return [problem for component in COMPONENTS
            for problem in component.verify_problems(config, root)]


def serve(name: str, config: Config) -> None:
    """The long-running container command: keep the daemon up beside the verified driver until
    SIGTERM or SIGINT (then stop it and return). Raises the daemon's error when it cannot be
    kept up."""
    import signal  # only the container command waits for signals
    import threading

    from installer.components.supervisor import Supervisor

    root = HostRoot(config.root)
    daemon = named(name).supervised(config, root)
    if hasattr(daemon, "diagnose"):  # a daemon that waits for the fabric names why it waits
        daemon.diagnose = lambda gpus: fabric_diagnosis(root, gpus)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("%s: signal %d: stopping", name, signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        Supervisor(daemon, root, config.daemon_restarts, stop,
                   lock_file=Layout.from_config(config, root).lock_file,
                   components=names()).run()
    finally:
        close = getattr(daemon, "close", None)
        if close is not None:
            close()
