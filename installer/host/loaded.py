"""What is loaded now: /proc/modules, the NVIDIA driver's version and flavour, and the
processes holding its device files."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal, NamedTuple

from installer.hostroot import HostRoot

Flavour = Literal["open", "proprietary"]

_VERSION_LINE = (
    r"^NVRM version: NVIDIA UNIX (?:(?P<open>Open) Kernel Module for (?P<oarch>\S+)"
    r"|(?P<parch>\S+) Kernel Module)\s+(?P<version>\d+\.\d+(?:\.\d+)?)\s"
)
_DRIVER_VERSION = r"^\d+\.\d+(?:\.\d+)?$"


class LoadedModule(NamedTuple):
    """One line of /proc/modules."""

    name: str
    size: int
    refcount: int
    users: tuple[str, ...] = ()
    state: str = "Live"

    @property
    def in_use(self) -> bool:
        return self.refcount > 0


class LoadedDriver(NamedTuple):
    """The NVIDIA kernel module that is loaded now, from /proc/driver/nvidia/version."""

    version: str | None
    flavour: Flavour | None
    first_line: str


class Holder(NamedTuple):
    """A process with an open file under a watched path prefix (e.g. /dev/nvidia0)."""

    pid: int
    command: str
    path: str


def parse_proc_modules(text: str) -> tuple[LoadedModule, ...]:
    """Parse /proc/modules: `name size refcount users state address [taints]`."""
    modules: list[LoadedModule] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or not fields[1].isdigit():
            continue
        # refcount is "-" on kernels built without module unloading.
        refcount = int(fields[2]) if fields[2].isdigit() else 0
        users_field = fields[3] if len(fields) > 3 else "-"
        users = () if users_field == "-" else tuple(u for u in users_field.split(",") if u)
        state = fields[4] if len(fields) > 4 else "Live"
        modules.append(LoadedModule(fields[0], int(fields[1]), refcount, users, state))
    return tuple(modules)


def loaded_modules(root: HostRoot) -> tuple[LoadedModule, ...]:
    """The modules in the host's /proc/modules (empty when unreadable)."""
    return parse_proc_modules(root.read_text("/proc/modules", "") or "")


def parse_driver_version(text: str) -> tuple[str | None, Flavour | None]:
    """Version and flavour from the first line of /proc/driver/nvidia/version."""
    first = text.splitlines()[0] if text else ""
    match = re.match(_VERSION_LINE, first)
    if match is None:
        return None, None
    flavour: Flavour = "open" if match.group("open") else "proprietary"
    return match.group("version"), flavour


def loaded_driver(root: HostRoot) -> LoadedDriver | None:
    """The loaded NVIDIA driver, or None when /proc/driver/nvidia/version is absent."""
    text = root.read_text("/proc/driver/nvidia/version")
    if text is None:
        return None
    version, flavour = parse_driver_version(text)
    if version is None:
        # An unfamiliar first line: /sys/module/nvidia/version holds the version alone.
        plain = (root.read_text("/sys/module/nvidia/version") or "").strip()
        version = plain if re.fullmatch(_DRIVER_VERSION, plain) else None
    first = text.splitlines()[0] if text else ""
    return LoadedDriver(version=version, flavour=flavour, first_line=first)


def holders_of(root: HostRoot, prefix: str = "/dev/nvidia") -> list[Holder]:
    """Processes with an open file whose path starts with `prefix`, by /proc/<pid>/fd.

    Processes that exit during the scan, or whose fds are not readable, are skipped.
    """
    proc = root.local_resolved("/proc")
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []
    seen: set[tuple[int, str]] = set()
    for pid in pids:
        fd_dir = proc / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target.startswith(prefix):
                seen.add((int(pid), target))
    holders = [Holder(pid, _command(proc / str(pid)), path) for pid, path in sorted(seen)]
    return holders


def _command(pid_dir: Path) -> str:
    try:
        comm = (pid_dir / "comm").read_text().strip()
    except OSError:
        comm = ""
    if comm:
        return comm
    try:
        argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return argv[0].decode(errors="replace") if argv and argv[0] else "?"
