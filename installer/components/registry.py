"""The registered components and what the plan and the container commands ask of them all."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from installer import host
from installer.components import (
    fabric,
    fabricmanager,
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

# Every component, in plan order: a new one is its module (a `Component`) and a line here.
COMPONENTS: tuple[Component, ...] = (fabricmanager.COMPONENT, persistenced.COMPONENT,
                                     imexd.COMPONENT)


# Why a fabric is not complete: each entry says it of the GPUs NVML reported, a phrase each
# (`fabric.Diagnosis`); `installer verify` and the fabricmanager container's error name them.
FABRIC_DIAGNOSES: tuple[fabric.Diagnosis, ...] = (
    fabricmanager.fabric_reasons, nvlink5.fabric_reasons, fabric.partition_reasons)


def fabric_diagnosis(root: HostRoot, gpus: Sequence[GpuInfo]) -> list[str]:
    """Every registered diagnosis's reasons why the fabric of `gpus` is not complete."""
    return [reason for diagnose in FABRIC_DIAGNOSES for reason in diagnose(root, gpus)]


def named(name: str) -> Component:
    """The registered component `name` (`installer <name>`). Raises KeyError for another."""
    for component in COMPONENTS:
        if component.name == name:
            return component
    raise KeyError(name)


def names() -> tuple[str, ...]:
    """The readiness files the scheduling gate and the node's condition wait for beside the
    driver's: those of every component but the opt-in ones."""
    return tuple(c.name for c in COMPONENTS if c.awaited)


def optional() -> tuple[str, ...]:
    """The opt-in components: reported where their container wrote a readiness file, never
    waited for."""
    return tuple(c.name for c in COMPONENTS if not c.awaited)


def commands() -> tuple[str, ...]:
    """Every component's container command (`installer <name>`) and readiness file."""
    return tuple(c.name for c in COMPONENTS)


def daemons() -> tuple[str, ...]:
    """The names of their daemons' processes (what an unload waits for or stops), in the order
    they are stopped: NVLSM, which the fabricmanager container runs beside nv-fabricmanager,
    after it."""
    return (*(c.daemon for c in COMPONENTS), nvlsm.DAEMON)


def decisions(ctx: Context) -> list[Decision]:
    # NVLink5 is said apart: it is why Fabric Manager applies there, and what NVLSM needs.
    # IMEX has no daemon of ours (the DRA driver runs it): only its decision and step.
    return [nvlink5.decision(ctx), imex.decision(ctx),
            *(component.decision(ctx) for component in COMPONENTS)]


def steps(ctx: Context) -> list[Step]:
    """After the user space is in versions/<ver>/, before it is activated."""
    # NVLSM's InfiniBand modules before the components' downloads (a kernel that lacks them
    # stops the run before Fabric Manager is fetched), then NVLSM beside Fabric Manager.
    return (nvlink5.steps(ctx) + nvlsm.steps(ctx) + imex.steps(ctx)
            + [step for component in COMPONENTS for step in component.steps(ctx)])


def keeps_download(name: str, version: str, arch: str) -> bool:
    """A cached download of a component of `version` (kept while that version is installed)."""
    return any(component.keeps_download(name, version, arch) for component in COMPONENTS)


def fabric_required(root: HostRoot) -> tuple[bool, tuple[str, ...]]:
    """Whether readiness needs the NVLink fabric (an NVSwitch or NVLink5 node whose fabric the
    node manages), and the switches: the driver's list, else the PCI functions (none listed on
    an NVLink5 node, whose switches are behind its LPF ports)."""
    gpus = host.nvidia_gpus(root)
    fabric = nvlink5.fabric(root, tuple(g.device_id for g in gpus))
    switches = nvswitch.driver_switches(root) or tuple(s.address for s in fabric.switches)
    return fabric.needed, switches


def verify_sections(config: Config, root: HostRoot) -> dict[str, object]:
    """What the components add to `installer verify --json` (read-only): IMEX's channel
    device where IMEX is installed or the driver has the device."""
    channel = imex.channel(root)
    gpus = tuple(g.device_id for g in host.nvidia_gpus(root))
    if imex.wanted(config, gpus)[0] or channel["major"] is not None:
        return {"imex": channel}
    return {}


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
