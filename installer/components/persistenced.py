"""nvidia-persistenced of the installed driver, with persistence mode on: what
`installer persistenced` starts, watches, restarts and stops.

The real daemon always detaches: its parent returns 0 once the daemon initialised (1 after
"failed to initialize", the reason going to syslog), the daemon writes its pid to
/var/run/nvidia-persistenced/nvidia-persistenced.pid and its RPC socket beside it, and on
SIGTERM disables persistence mode, removes both and exits.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Union

from installer import host, runner
from installer.components.component import Part
from installer.config import Config
from installer.errors import PersistencedFailed
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.plan import Context, Decision

if TYPE_CHECKING:  # supervisor.py loads in the persistenced container only
    from installer.components.supervisor import Driver, Idle, Running

log = logging.getLogger(__name__)

NAME = "persistenced"
DAEMON = "nvidia-persistenced"
# Compiled into the daemon (NVPD_VAR_RUNTIME_DATA_PATH): in this process's own mount
# namespace, where the daemon runs; the DaemonSet mounts the host's /run/nvidia-persistenced
# there so the socket is the node's.
RUN_DIR = Path("/var/run/nvidia-persistenced")
PR_SET_CHILD_SUBREAPER = 36
OFF = "NVIDIA_INSTALLER_PERSISTENCED=false (the host manages persistence)"


def decision(config: Config) -> Decision:
    if not config.persistenced:
        return Decision("persistenced", "off", "NVIDIA_INSTALLER_PERSISTENCED=false: the host "
                        "manages persistence; the persistenced container idles (not-applicable)")
    return Decision("persistenced", "on", "the persistenced container runs this version's "
                    "nvidia-persistenced --persistence-mode (`installer persistenced`)")


def argv(binary: Path) -> list[str]:
    return [str(binary), "--persistence-mode", "--verbose"]


class Exited:
    """A start that failed: the daemon's parent said so."""

    def __init__(self, code: int) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code

    def stop(self, timeout: float) -> None:
        return None


class DetachedRunning:
    """The detached daemon, known by its pid (reaped here: this process is its subreaper)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.code: int | None = None

    def poll(self) -> int | None:
        if self.code is not None:
            return self.code
        try:
            found, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # not ours to reap (no subreaper): watch /proc instead
            if Path(f"/proc/{self.pid}").exists():
                return None
            self.code = 1
            return self.code
        if found == 0:
            return None
        self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def stop(self, timeout: float) -> None:
        if self.poll() is not None:
            return
        log.info("stopping %s (pid %d)", DAEMON, self.pid)
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.poll() is None:
            log.warning("%s ignored SIGTERM for %.0f s: killing it", DAEMON, timeout)
            os.kill(self.pid, signal.SIGKILL)
            while self.poll() is None and time.monotonic() < deadline + 10:
                time.sleep(0.1)


def become_subreaper() -> None:
    """Make the daemon (which detaches from its parent) our child to reap and watch."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: errno %d", ctypes.get_errno())


class PersistencedDaemon:
    """nvidia-persistenced --persistence-mode of the verified driver's version."""

    name = NAME

    def __init__(self, config: Config, root: HostRoot, run_dir: Path = RUN_DIR) -> None:
        self.config = config
        self.root = root
        self.run_dir = run_dir
        self.layout = Layout.from_config(config, root)
        self.output: collections.deque[str] = collections.deque(maxlen=20)

    def plan(self, driver: Driver) -> Union[Idle, Callable[[], Running]]:
        from installer.components.supervisor import Idle

        if not self.config.persistenced:
            return Idle(OFF)
        if not host.nvidia_gpus(self.root):
            return Idle("no NVIDIA GPU in /sys/bus/pci/devices")
        binary = self.layout.version_dir(driver.version) / "bin" / DAEMON
        if not binary.is_file():
            raise PersistencedFailed(f"{binary} is missing: the install of {driver.version} "
                                     "has no nvidia-persistenced")
        lib_dir = self.layout.version_dir(driver.version) / "lib64"

        def start() -> Running:
            command = argv(binary)
            log.info("starting %s %s: %s", DAEMON, driver.version, " ".join(command))
            result = runner.SubprocessRunner().run(
                command, check=False, timeout=120, env={"LD_LIBRARY_PATH": str(lib_dir)})
            self.output.extend(result.output.splitlines())
            for line in result.output.splitlines():
                log.info("%s: %s", DAEMON, line)
            if result.returncode != 0:
                return Exited(result.returncode)
            pid = self._pid()
            if pid is None:
                log.warning("%s started but wrote no pid to %s", DAEMON, self.pid_file)
                return Exited(1)
            log.info("%s runs as pid %d", DAEMON, pid)
            return DetachedRunning(pid)

        return start

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{DAEMON}.pid"

    def _pid(self) -> int | None:
        try:
            text = self.pid_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def ready(self, running: Running) -> str | None:
        """Once NVML reports persistence mode on for every GPU."""
        from installer import verify  # the container's loop only (the warm path never asks)

        gpus, problems = verify.nvml_gpus(self.layout.install_local, runner.SubprocessRunner())
        if problems or not gpus or any(g.persistence_mode != "enabled" for g in gpus):
            return None
        pid = running.pid if isinstance(running, DetachedRunning) else 0
        driver = host.loaded_driver(self.root)
        version = (driver.version if driver else None) or "unknown"
        return f"DRIVER_VERSION={version}\nSTATE=running\nPID={pid}\nPERSISTENCE_MODE=enabled\n"

    def failed(self, message: str) -> PersistencedFailed:
        said = "\n".join(self.output) or "(nothing: it logs to syslog)"
        return PersistencedFailed(f"{message}; its output:\n{said}")


class Persistenced(Part):
    """nvidia-persistenced as a registered component (components.COMPONENTS): no steps of its
    own (the driver's user space carries it), no download."""

    name = NAME
    command = True
    daemon = DAEMON
    awaited = True
    summary = ("Keep nvidia-persistenced of the verified driver running with persistence mode "
               "on (stopped with SIGTERM on exit and before the installer unloads a driver).")

    def decision(self, ctx: Context) -> Decision:
        return decision(ctx.config)

    def supervised(self, config: Config, root: HostRoot) -> PersistencedDaemon:
        become_subreaper()
        return PersistencedDaemon(config, root)


COMPONENT = Persistenced()
