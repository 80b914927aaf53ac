"""Our daemons as processes on the host: found in its /proc, stopped with SIGTERM and waited
for, before a driver unload frees /dev/nvidia*."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer.hostroot import HostRoot

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Daemon:
    pid: int
    name: str
    exe: str


def find(root: HostRoot, names: tuple[str, ...], install_dirs: tuple[PurePosixPath, ...]
         ) -> list[Daemon]:
    """Processes whose program is one of `names` in one of `install_dirs` (as the host or a
    container sees the install dir): ours, never a daemon the host runs from its own packages.
    The program is the executable, or the script an interpreter runs (argv[0] or argv[1]; its
    comm is then the interpreter's). Reads the host's /proc only."""
    proc = root.local_resolved("/proc")
    found = []
    try:
        pids = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            exe = os.readlink(proc / pid / "exe").removesuffix(" (deleted)")
            argv = (proc / pid / "cmdline").read_bytes().split(b"\0")[:2]
        except OSError:  # gone, a kernel thread, or not ours to read
            continue
        for candidate in (exe, *(a.decode(errors="replace") for a in argv)):
            path = PurePosixPath(candidate)
            if path.name in names and any(_under(path, d) for d in install_dirs):
                found.append(Daemon(int(pid), path.name, candidate))
                break
    return sorted(found, key=lambda d: d.pid)


def _under(path: PurePosixPath, directory: PurePosixPath) -> bool:
    try:
        path.relative_to(directory)
    except ValueError:
        return False
    return True


def terminate(root: HostRoot, daemons: list[Daemon], timeout: float = 15.0) -> list[Daemon]:
    """SIGTERM each daemon and wait until it is gone (SIGKILL after `timeout`). Returns those
    that could not be signalled from here or survived (another PID namespace without hostPID)."""
    proc = root.local_resolved("/proc")
    signalled = []
    left = []
    for daemon in daemons:
        if _signal(proc / str(daemon.pid), signal.SIGTERM):
            log.info("stopping %s (pid %d) before the driver is unloaded", daemon.name,
                     daemon.pid)
            signalled.append(daemon)
        else:
            left.append(daemon)
    deadline = time.monotonic() + timeout
    pending = list(signalled)
    while pending and time.monotonic() < deadline:
        pending = [d for d in pending if alive(proc / str(d.pid))]
        if pending:
            time.sleep(0.1)
    for daemon in pending:
        log.warning("%s (pid %d) ignored SIGTERM for %.0f s: killing it", daemon.name,
                    daemon.pid, timeout)
        _signal(proc / str(daemon.pid), signal.SIGKILL)
    kill_deadline = time.monotonic() + 5
    while pending and time.monotonic() < kill_deadline:
        pending = [d for d in pending if alive(proc / str(d.pid))]
        if pending:
            time.sleep(0.1)
    return left + pending


def terminate_in_order(root: HostRoot, daemons: list[Daemon], names: tuple[str, ...],
                       timeout: float = 15.0) -> list[Daemon]:
    """`terminate` one name at a time, in the order of `names` (each group gone before the
    next is signalled: Fabric Manager before the NVLSM it talks to). Returns what `terminate`
    returns for them all."""
    left = []
    for name in names:
        group = [d for d in daemons if d.name == name]
        if group:
            left += terminate(root, group, timeout)
    return left


def _signal(pid_dir: Path, signum: int) -> bool:
    """Signal through a /proc/<pid> directory descriptor: the right process even if the pid
    was reused, and refused (False) when it lives outside our PID namespace."""
    try:
        fd = os.open(pid_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        signal.pidfd_send_signal(fd, signum)
    except (OSError, AttributeError):
        return False
    finally:
        os.close(fd)
    return True


def alive(pid_dir: Path) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        status = (pid_dir / "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("State:"):
            return line.split()[1:2] != ["Z"]
    return True
