"""NVLSM beside Fabric Manager on NVLink5 nodes: its command line, and the pair `installer
fabricmanager` keeps up there (NVLSM on the Limited PF's port GUID, its socket, then Fabric
Manager on the same GUID; stopped in the other order)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from installer import runner
from installer.components import nvlink5, nvlsm_archive
from installer.components.component import Part
from installer.dirs import scratch
from installer.errors import NvlsmMissing
from installer.layout import Layout
from installer.plan import Context, ShippedBy, Step

log = logging.getLogger(__name__)

DAEMON = "nvlsm"
# NVIDIA's vendor script waits a fixed 5 s for the socket; a loaded node can take longer, but a
# port NVLSM cannot bind never opens it: bounded, then counted as a failed start.
SOCKET_WAIT = 60.0
SOCKET_NAME = "fm_sm_ipc.socket"
PID_NAME = "nvlsm.pid"


def nvlsm_argv(binary: Path, config_file: Path, guid: str, pid_file: Path) -> list[str]:
    """As NVIDIA's start script runs it (an OpenSM build: --config, --guid, --pid_file)."""
    return [str(binary), "--config", str(config_file), "--guid", guid, "--pid_file",
            str(pid_file)]


def fabricmanager_argv(binary: Path, config_file: Path, guid: str) -> list[str]:
    return [str(binary), "--config", str(config_file), "--fm-sm-mgmt-port-guid", guid]


class PairRunning:
    """NVLSM and Fabric Manager, one unit for the supervisor: it has exited when either has
    (the other is stopped then), and stops Fabric Manager before NVLSM (the order NVIDIA's
    driver container unloads in)."""

    def __init__(self, nvlsm: runner.Child, fabricmanager: runner.Child | None,
                 code: int | None = None) -> None:
        self.nvlsm = nvlsm
        self.child = fabricmanager
        self.code = code

    @property
    def pid(self) -> int:
        """Fabric Manager's (what `ready` reports), 0 before it started."""
        return self.child.pid if self.child is not None else 0

    def poll(self) -> int | None:
        if self.code is not None:
            return self.code
        fm = self.child.poll() if self.child is not None else None
        sm = self.nvlsm.poll()
        if fm is None and sm is None:
            return None
        if sm is not None:
            log.warning("%s exited with status %s: stopping Fabric Manager too", DAEMON, sm)
        self.stop(15.0)
        self.code = fm if fm is not None else sm
        return self.code

    def stop(self, timeout: float) -> None:
        if self.child is not None:
            self.child.stop(timeout)
        self.nvlsm.stop(timeout)


def start_pair(nvlsm: list[str], fabricmanager: list[str], socket: Path,
               env: dict[str, str], on_nvlsm: Callable[[str], None],
               on_fabricmanager: Callable[[str], None], *,
               wait: float = SOCKET_WAIT, clock: Callable[[], float] = time.monotonic
               ) -> PairRunning:
    """Start NVLSM, wait (bounded) for its socket, then Fabric Manager. A NVLSM that exits or
    never opens the socket makes an exited pair (the supervisor restarts it with backoff or
    gives up), never a Fabric Manager without its subnet manager."""
    if socket.exists():  # a previous NVLSM's: NVLSM makes it anew
        socket.unlink()
    log.info("starting %s: %s", DAEMON, " ".join(nvlsm))
    sm = runner.spawn(nvlsm, env=env, on_line=on_nvlsm)
    deadline = clock() + wait
    while not socket.exists():
        code = sm.poll()
        if code is not None:
            log.warning("%s exited with status %s before it opened %s", DAEMON, code, socket)
            return PairRunning(sm, None, code)
        if clock() > deadline:
            on_nvlsm(f"(installer) {socket} did not appear within {wait:.0f} s")
            pair = PairRunning(sm, None, 1)
            pair.stop(15.0)
            return pair
        time.sleep(0.05)
    log.info("%s opened %s; starting nv-fabricmanager: %s", DAEMON, socket,
             " ".join(fabricmanager))
    return PairRunning(sm, runner.spawn(fabricmanager, env=env, on_line=on_fabricmanager))


def pair_start(layout: Layout, driver: str, found: nvlink5.Nvlink5, fabricmanager: Path,
               fm_config: Path, env: dict[str, str], run_dir: Path,
               on_line: Callable[[str], None]) -> Callable[[], PairRunning]:
    """How `installer fabricmanager` starts an NVLink5 node's pair: NVLSM of this install on
    the Limited PF's port GUID, then Fabric Manager on the same GUID. Raises NvlsmMissing when
    NVLSM is not installed beside the driver or the port has no GUID (mlx5_ib made no IB
    device for it)."""
    if nvlsm_archive.installed(layout, driver) is None:
        raise NvlsmMissing(f"{found.reason}, but {nvlsm_archive.binary(layout, driver)} (NVLSM "
                           f"installed with driver {driver}) is not there")
    port = found.port
    if port is None or port.guid is None:
        raise NvlsmMissing(f"{found.reason}: the port has no GUID in sysfs (is mlx5_ib "
                           "loaded? `installer run` loads it)")
    guid = port.guid
    sm_argv = nvlsm_argv(nvlsm_archive.binary(layout, driver),
                         nvlsm_archive.config_file(layout, driver), guid, run_dir / PID_NAME)
    fm_argv = fabricmanager_argv(fabricmanager, fm_config, guid)

    def start() -> PairRunning:
        run_dir.mkdir(parents=True, exist_ok=True)
        return start_pair(sm_argv, fm_argv, run_dir / SOCKET_NAME, env,
                          lambda line: on_line(f"{DAEMON}: {line}"), on_line)

    return start


class Nvlsm(Part):
    """NVLSM as a registered component (components.COMPONENTS): its step beside Fabric
    Manager's; its daemon runs in the fabricmanager container behind nv-fabricmanager, so it
    has no command of its own and is stopped after it. The plan says it in NVLink5's decision."""

    name = "nvlsm"
    daemon = DAEMON
    stop_order = 1

    def steps(self, ctx: Context) -> list[Step]:
        """NVLSM into versions/<ver>/ beside Fabric Manager (the runfile source's; on a dnf host
        sources/dnf/nvlsm.py installs NVIDIA's nvlsm package instead)."""
        if not nvlink5.applies(ctx) or (
                ctx.target.ships_user_space(DAEMON) is not ShippedBy.COMPONENT):
            return []
        layout, driver, arch = ctx.layout, ctx.target.version, ctx.facts.arch

        def satisfied() -> bool:
            return nvlsm_archive.installed(layout, driver) is not None

        def apply() -> None:
            # One step: which archive (and its version) is known only once the JSON is read.
            listed, archive = nvlsm_archive.fetch(ctx.config, layout, driver, arch)
            with scratch(layout.tmp, within=layout.cache_anchor) as tmp:
                placed = nvlsm_archive.unpack_and_install(archive, tmp, layout, driver,
                                                          listed.version)
            log.info("installed NVLSM %s into %s: %s", listed.version, layout.version_dir(driver),
                     ", ".join(placed))

        return [Step("install-nvlsm", "download the NVLSM archive ("
                     + nvlsm_archive.digest_source(ctx.config, driver) + ") and put nvlsm and "
                     "nvlsm.conf into versions/<ver>/ beside Fabric Manager", satisfied, apply)]


COMPONENT = Nvlsm()
