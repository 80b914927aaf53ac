"""What the host already has, as the dnf source reads it without starting dnf: the rpm
database's packages, the DKMS tree, NVIDIA's installed module files, dnf's history and the
nvidia-driver module state (the argv it runs: installer.sources.dnf.commands)."""

from __future__ import annotations

import configparser
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer.hostroot import HostRoot
from installer.runner import Runner
from installer.sources.dnf.commands import MODULE, rpm_base, rpm_query_argv

MODULE_STATE = PurePosixPath(f"/etc/dnf/modules.d/{MODULE}.module")
DNF_HISTORY = PurePosixPath("/var/lib/dnf/history.sqlite")
DKMS_TREE = PurePosixPath("/var/lib/dkms")
KO_SUFFIXES = (".ko", ".ko.xz", ".ko.zst")
NVIDIA_MODULES = ("nvidia", "nvidia-modeset", "nvidia-uvm", "nvidia-drm", "nvidia-peermem")


def dkms_installed(status_output: str, name: str, version: str, kernel: str) -> bool:
    """`dkms status` prints `<name>/<v>, <k>, <arch>: installed` (older: `<name>, <v>, ...`)."""
    for line in status_output.splitlines():
        head, _, state = line.rpartition(":")
        fields = [f.strip() for f in head.replace("/", ",").split(",")]
        if state.strip().startswith("installed") and fields[:3] == [name, version, kernel]:
            return True
    return False


def dkms_built(name: str, version: str, kernel: str) -> PurePosixPath:
    """Where DKMS keeps a module built for a kernel."""
    return DKMS_TREE / name / version / kernel


def make_log(name: str, version: str) -> PurePosixPath:
    return DKMS_TREE / name / version / "build" / "make.log"


def last_transaction(root: HostRoot) -> int:
    """The newest dnf history id of the host (0 without history); read from dnf's sqlite
    history, so no dnf process starts."""
    path = root.local(DNF_HISTORY)
    if not path.is_file():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            row = db.execute("SELECT max(id) FROM trans").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0] or 0)


def module_files(root: HostRoot, kernel: str) -> dict[str, Path]:
    """NVIDIA's modules under /lib/modules/<k>/extra (DKMS: extra/, precompiled kmods:
    extra/drivers/video/nvidia/), module name -> file, compressed or not."""
    extra = root.local(f"/lib/modules/{kernel}/extra")
    found: dict[str, Path] = {}
    if not extra.is_dir():
        return found
    for path in sorted(extra.rglob("nvidia*")):
        for suffix in KO_SUFFIXES:
            name = path.name[: -len(suffix)] if path.name.endswith(suffix) else ""
            if name in NVIDIA_MODULES and path.is_file() and name not in found:
                found[name] = path
    return found


def installed_versions(root: HostRoot, runner: Runner, names: list[str]) -> dict[str, str]:
    """name -> version for the packages among `names` that the host's rpm database has."""
    result = runner.run(rpm_query_argv(root, names), check=False, timeout=120)
    found: dict[str, str] = {}
    wanted = set(names)
    for line in result.output.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] in wanted and re.match(r"^\d", fields[1]):
            found[fields[0]] = fields[1]
    return found


def all_installed(root: HostRoot, runner: Runner, specs: list[str]) -> bool:
    """Whether the host's rpm database has every package spec (`name-version-release.arch`
    allowed); rpm exits non-zero when one is missing."""
    return runner.run([*rpm_base(root), "-q", *specs], check=False, timeout=120).ok


@dataclass(frozen=True)
class ModuleState:
    stream: str | None
    state: str | None


def module_state(root: HostRoot) -> ModuleState:
    """The host's nvidia-driver module state from /etc/dnf/modules.d (what `dnf module list
    --enabled` reads), without starting dnf or touching the network."""
    text = root.read_text(MODULE_STATE)
    if text is None:
        return ModuleState(None, None)
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return ModuleState(None, None)
    if not parser.has_section(MODULE):
        return ModuleState(None, None)
    section = parser[MODULE]
    return ModuleState(section.get("stream") or None, section.get("state") or None)
