"""Keeps one daemon running beside the driver the installer verified: started once the
readiness file names a loaded driver, stopped when the file goes (the installer replaces the
driver), restarted with backoff when it dies, given up on (an error) when it keeps dying."""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol, Union

from installer import host, safefs
from installer.errors import InstallerError, PlantedLink
from installer.host import readiness
from installer.hostroot import HostRoot
from installer.layout import GPUS_READY_FILE, READY_FILE

log = logging.getLogger(__name__)

WINDOW_SECONDS = 600.0
BACKOFF_MAX = 30.0
# Written by an installer that is about to unload the driver (or free it for the upgrade
# protocol), for as long as it holds the host lock.
PAUSE_FILE = READY_FILE.parent / "daemons-paused"


@dataclass(frozen=True)
class Driver:
    """The driver the installer verified (the readiness file) and that is still loaded."""

    version: str
    install_dir: PurePosixPath


def verified_driver(root: HostRoot) -> Driver | None:
    text = root.read_text(READY_FILE)
    if not text:
        return None
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    version = values.get("DRIVER_VERSION", "")
    loaded = host.loaded_driver(root)
    if not version or loaded is None or loaded.version != version:
        return None
    return Driver(version, PurePosixPath(values.get("INSTALL_DIR", "/")))


def paused(root: HostRoot, lock_file: Path | None) -> bool:
    """An installer asked the daemons to stay stopped and still holds the host lock (a pause
    file left by an installer that died is removed)."""
    marker = root.local(PAUSE_FILE)
    if not marker.exists():
        return False
    if lock_file is None or not lock_file.exists():
        return True
    try:
        # Read-only (the install dir may be mounted so), and never through a link a pod
        # planted: flocking its target would say nothing about an installer.
        fd = safefs.open_file(lock_file, os.O_RDONLY)
    except (OSError, PlantedLink) as exc:
        log.warning("cannot check the host lock %s: %s", lock_file,
                    exc.message if isinstance(exc, PlantedLink) else exc)
        return True
    with os.fdopen(fd, "rb") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    log.info("%s is left from an installer that is gone: resuming", PAUSE_FILE)
    marker.unlink(missing_ok=True)
    return False


def ready_file(name: str) -> PurePosixPath:
    """Where `name`'s container says it is up (beside the driver's readiness file; the
    scheduling gate waits for it: installer/host/readiness.py)."""
    return readiness.component_file(name)


def restarts_file(name: str) -> PurePosixPath:
    """How many times `name`'s daemon died and was started again on this boot (/run is a
    tmpfs): the container's own count resets when it restarts, this one does not (the metrics
    container reads it)."""
    return READY_FILE.parent / f"{name}-restarts"


def sync_gpus_ready(root: HostRoot, components: tuple[str, ...]) -> bool:
    """Write GPUS_READY_FILE (`DRIVER_VERSION=<v>`) when nothing keeps the node from GPU work
    (readiness.pending(root, components) is empty: the same rule as the scheduling gate), and
    remove it otherwise. Every component container calls it on each look, so the file follows
    the last one to change. Returns whether the file is there now."""
    version = None if readiness.pending(root, components) else readiness.verified_version(root)
    if version is None:
        path = root.local(GPUS_READY_FILE)
        if path.exists():
            path.unlink()
            log.info("GPUs not ready: removed %s", GPUS_READY_FILE)
        return False
    text = f"DRIVER_VERSION={version}\n"
    if root.read_text(GPUS_READY_FILE) != text:
        root.write_atomic(GPUS_READY_FILE, text)
        log.info("GPUs ready (driver %s and every component up): wrote %s", version,
                 GPUS_READY_FILE)
    return True


def read_restarts(root: HostRoot, name: str) -> int:
    """The count in `name`'s restarts file; 0 when absent or not a count (see restarts_valid)."""
    text = (root.read_text(restarts_file(name)) or "").strip()
    return int(text) if restarts_valid(text) and text else 0


def restarts_valid(text: str) -> bool:
    """Whether a restarts file's stripped text is empty or a count. ASCII digits only, and a
    bounded number of them: str.isdigit() also takes '²', which int() refuses, and int()
    refuses more than 4300 digits."""
    return not text or (text.isascii() and text.isdigit() and len(text) <= 18)


class Running(Protocol):
    """A started daemon."""

    def poll(self) -> int | None: ...

    def stop(self, timeout: float) -> None: ...


@dataclass(frozen=True)
class Idle:
    """Nothing to run for this driver on this node, and why."""

    reason: str


class Daemon(Protocol):
    """What the supervisor needs of one daemon."""

    name: str

    def plan(self, driver: Driver) -> Union[Idle, Callable[[], Running]]:
        """Idle, or how to start it (raising an InstallerError when it cannot be started at all)."""

    def ready(self, running: Running) -> str | None:
        """The readiness file's content once it does its job, else None."""

    def failed(self, message: str) -> InstallerError:
        """The error the container exits with when the daemon cannot be kept up."""


@dataclass
class Supervisor:
    daemon: Daemon
    root: HostRoot
    restarts: int
    stop: threading.Event = field(default_factory=threading.Event)
    poll: float = 1.0
    backoff: float = 1.0
    clock: Callable[[], float] = time.monotonic
    lock_file: Path | None = None
    # Every component's name (registry.names()): with them, each look also keeps
    # GPUS_READY_FILE true (sync_gpus_ready).
    components: tuple[str, ...] = ()

    def run(self) -> None:
        """Until `stop` is set (then the daemon is stopped and this returns). Raises the
        daemon's error when it died more than `restarts` times within ten minutes, and the
        errors of a daemon that cannot be started at all."""
        name = self.daemon.name
        marker = ready_file(name)
        failures: collections.deque[float] = collections.deque()
        running: Running | None = None
        running_for: Driver | None = None
        said = ""
        ready = False
        try:
            while not self.stop.is_set():
                self._sync()
                driver = verified_driver(self.root)
                if paused(self.root, self.lock_file):
                    driver = None
                if running is not None and driver != running_for:
                    log.info("%s: the driver %s is no longer the verified one, or an installer "
                             "is replacing it: stopping %s", name,
                             running_for.version if running_for else "?", name)
                    running.stop(15.0)
                    running, ready = None, False
                    self._clear(marker)
                if driver is None:
                    self._clear(marker)
                    said = self._say(said, f"{name}: waiting for the installer to verify a "
                                     f"driver ({READY_FILE})")
                    self.stop.wait(self.poll)
                    continue
                if running is None:
                    while failures and self.clock() - failures[0] > WINDOW_SECONDS:
                        failures.popleft()
                    if failures and self.clock() - failures[-1] < self._delay(len(failures)):
                        # The readiness file is read again after every wait: a driver being
                        # replaced is never started on.
                        self.stop.wait(min(self.poll, self._delay(len(failures))))
                        continue
                    plan = self.daemon.plan(driver)
                    if isinstance(plan, Idle):
                        said = self._say(said, f"{name}: not needed on this node ({plan.reason})"
                                         "; idle")
                        self._write(marker, f"DRIVER_VERSION={driver.version}\n"
                                    f"STATE=not-applicable\nREASON={plan.reason}\n")
                        self.stop.wait(self.poll * 10)
                        continue
                    running, running_for, said = plan(), driver, ""
                    continue
                code = running.poll()
                if code is not None:
                    running, ready = None, False
                    self._clear(marker)
                    failures.append(self.clock())
                    self.root.write_atomic(restarts_file(name),
                                           f"{read_restarts(self.root, name) + 1}\n")
                    if len(failures) > self.restarts:
                        raise self.daemon.failed(
                            f"{name} exited {len(failures)} times within "
                            f"{WINDOW_SECONDS / 60:.0f} minutes (last exit status {code}); "
                            f"not restarting it again")
                    log.warning("%s exited with status %s; restarting it in %.0f s (%d of %d)",
                                name, code, self._delay(len(failures)), len(failures),
                                self.restarts)
                    continue
                if not ready:
                    content = self.daemon.ready(running)
                    if content is not None:
                        self._write(marker, content)
                        ready = True
                        log.info("%s: ready (%s)", name, marker)
                self.stop.wait(self.poll)
        finally:
            if running is not None:
                running.stop(15.0)
            self._clear(marker)

    def _sync(self) -> None:
        if self.components:
            sync_gpus_ready(self.root, self.components)

    def _delay(self, failures: int) -> float:
        return float(min(BACKOFF_MAX, self.backoff * 2.0 ** (failures - 1)))

    def _say(self, said: str, message: str) -> str:
        if message != said:
            log.info("%s", message)
        return message

    def _write(self, marker: PurePosixPath, content: str) -> None:
        if self.root.read_text(marker) != content:
            self.root.write_atomic(marker, content)
        self._sync()

    def _clear(self, marker: PurePosixPath) -> None:
        path = self.root.local(marker)
        if path.exists():
            path.unlink()
        self._sync()
