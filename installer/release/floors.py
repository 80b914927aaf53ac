"""Driver floors: releases that cannot build on a kernel or OS release, in a module flavour, or
cannot drive a GPU (shipped as installer/release/data/floors.json, each fact with its source)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from installer.errors import DriverBelowFloor
from installer.release.catalog import (
    LTS,
    PRODUCTION,
    Branch,
    Catalog,
    Release,
    is_version,
    version_key,
    version_major,
)

SHIPPED = "installer/release/data/floors.json"
_FLAVOURS = ("open", "proprietary")
_WHEN_KEYS = ("kernel_from", "kernel_before", "os", "os_version", "flavour", "gpu")


class HostShape(NamedTuple):
    """What floors look at: the kernel modules are built for, the OS release and the GPUs."""

    kernel: str
    os_id: str
    os_version: str
    gpu_ids: tuple[int, ...] = ()


class Floor(NamedTuple):
    id: str
    why: str
    source: str
    kernel_from: tuple[int, ...] | None = None
    kernel_before: tuple[int, ...] | None = None
    os: str | None = None
    os_version: str | None = None
    flavour: str | None = None
    gpu: int | None = None
    min_branch: int | None = None
    min_release: tuple[tuple[int, str], ...] = ()
    fails_branches: tuple[int, ...] = ()

    def applies_to(self, shape: HostShape) -> bool:
        """Whether this host meets every condition but the flavour (chosen later)."""
        kernel = kernel_numbers(shape.kernel)
        if self.kernel_from is not None and (kernel is None or kernel < self.kernel_from):
            return False
        if self.kernel_before is not None and (kernel is None or kernel >= self.kernel_before):
            return False
        if self.os is not None and self.os != shape.os_id:
            return False
        if self.os_version is not None and self.os_version != shape.os_version:
            return False
        return self.gpu is None or self.gpu in shape.gpu_ids

    def allows(self, version: str, flavour: str | None = None) -> bool:
        """Whether `version` (in `flavour`; None: either) gets past this floor."""
        if self.flavour is not None and flavour is not None and flavour != self.flavour:
            return True
        major = version_major(version)
        if major in self.fails_branches:
            return False
        if self.min_branch is not None and major < self.min_branch:
            return False
        listed = dict(self.min_release)
        if major in listed:
            return version_key(version) >= version_key(listed[major])
        # A branch between listed ones (or past min_branch, before the newest listed) has no
        # release known to work; a branch newer than every listed one is let through.
        return not listed or major > max(listed)

    def asks(self) -> str:
        """Human words for what this floor asks, e.g. 'R595 or newer (595.91.07 or newer in
        R595, 610.57.04 or newer in R610)'."""
        parts = []
        if self.min_branch is not None:
            parts.append(f"R{self.min_branch} or newer")
        if self.min_release:
            parts.append("(" + ", ".join(f"{v} or newer in R{b}" for b, v in self.min_release)
                         + ")")
        if self.fails_branches:
            parts.append("not " + " or ".join(f"R{b}" for b in self.fails_branches))
        asked = " ".join(parts)
        return f"{asked} for {self.flavour} kernel modules" if self.flavour else asked

    def describe(self) -> str:
        """`<id>: <asks>: <why> (source: ...)`, the words plan and the errors print."""
        return f"{self.id}: {self.asks()}: {self.why} (source: {self.source})"


def kernel_numbers(release: str) -> tuple[int, ...] | None:
    """7.0.0-14-generic -> (7, 0, 0); 6.12.107+deb13-amd64 -> (6, 12, 107); None if no
    version leads the release."""
    match = re.match(r"(?a)(\d+)\.(\d+)(?:\.(\d+))?", release)
    if match is None:
        return None
    return tuple(int(part) for part in match.groups("0"))


def applicable(floors: Iterable[Floor], shape: HostShape) -> tuple[Floor, ...]:
    return tuple(f for f in floors if f.applies_to(shape))


def violated(floors: Iterable[Floor], version: str, flavour: str | None = None) -> list[Floor]:
    return [f for f in floors if not f.allows(version, flavour)]


def blocks_every(floors: Iterable[Floor], version: str, flavours: Sequence[str]) -> list[Floor]:
    """The floors that stop `version` whichever of `flavours` is chosen (empty: it passes in
    at least one): a floor of one flavour stops it only when that is the only flavour left."""
    stopped = {flavour: violated(floors, version, flavour) for flavour in flavours}
    if any(not found for found in stopped.values()):
        return []
    seen: dict[str, Floor] = {}
    for found in stopped.values():
        for floor in found:
            seen.setdefault(floor.id, floor)
    return list(seen.values())


class FloorGate:
    """The host's floors against the flavours a release could still be built in (`flavours`:
    branch major -> flavours the GPUs and settings leave) and the GPUs' branches (`supports`)."""

    def __init__(self, floors: tuple[Floor, ...], flavours: Callable[[int], list[str]],
                 supports: Callable[[int], bool], allow: bool) -> None:
        self.floors, self.flavours, self.supports, self.allow = floors, flavours, supports, allow

    def blocking(self, version: str) -> list[Floor]:
        if not self.floors:
            return []
        return blocks_every(self.floors, version, self.flavours(version_major(version)))

    def release_in(self, branch: Branch) -> Release | None:
        """The newest release of `branch` that meets every floor."""
        for release in branch.releases:
            if not self.blocking(release.version):
                return release
        return None

    def require(self, version: str, what: str, catalog: Catalog, reasons: list[str]) -> None:
        """Raise DriverBelowFloor for an explicit request below a floor (with `allow`: a
        reason saying it goes on anyway)."""
        stopped = self.blocking(version)
        if not stopped:
            return
        named = "; ".join(f.describe() for f in stopped)
        if self.allow:
            reasons.append(f"{what} is below this host's floor: {named}; installing anyway "
                           "(NVIDIA_INSTALLER_ALLOW_BELOW_FLOOR=true)")
            return
        raise DriverBelowFloor(f"{what} is below this host's floor: {named}"
                               + self._instead(catalog))

    def require_branch(self, branch: Branch, what: str, catalog: Catalog,
                       reasons: list[str]) -> None:
        """An explicit branch or alias whose releases all fall below a floor."""
        if self.release_in(branch) is None:
            self.require(branch.newest.version, what, catalog, reasons)

    def _instead(self, catalog: Catalog) -> str:
        for branch in catalog.of_types(PRODUCTION, LTS) + catalog.branches:
            release = self.release_in(branch)
            if release is not None and self.supports(branch.major):
                return f"; the newest release in the catalog that meets them: {release.version}"
        return ""


@functools.lru_cache(maxsize=1)
def shipped() -> tuple[Floor, ...]:
    """The floors shipped with the package (parsed once per process)."""
    data = (Path(__file__).parent / "data" / "floors.json").read_bytes()
    return parse(json.loads(data))


def parse(document: Any) -> tuple[Floor, ...]:
    """Floors from floors.json content; raises ValueError naming what is malformed."""
    if not isinstance(document, dict) or not isinstance(document.get("floors"), list):
        raise ValueError("floors.json must hold an object with a 'floors' list")
    found: list[Floor] = []
    for index, entry in enumerate(document["floors"]):
        found.append(_floor(index, entry))
    ids = [f.id for f in found]
    if len(set(ids)) != len(ids):
        raise ValueError("floors.json: floor ids must be unique")
    return tuple(found)


def _floor(index: int, entry: Any) -> Floor:
    where = f"floors[{index}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be an object")
    for key in ("id", "why", "source"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise ValueError(f"{where}: {key!r} must be a non-empty string")
    when = entry.get("when")
    if not isinstance(when, dict) or not when or set(when) - set(_WHEN_KEYS):
        raise ValueError(f"{where}: 'when' must name some of {', '.join(_WHEN_KEYS)}")
    kernel_from = _kernel(where, when.get("kernel_from"))
    kernel_before = _kernel(where, when.get("kernel_before"))
    flavour = when.get("flavour")
    if flavour is not None and flavour not in _FLAVOURS:
        raise ValueError(f"{where}: flavour {flavour!r} is not open or proprietary")
    gpu = when.get("gpu")
    if gpu is not None and not (isinstance(gpu, str) and re.fullmatch(r"0x[0-9A-Fa-f]{4}", gpu)):
        raise ValueError(f"{where}: gpu {gpu!r} is not a PCI device id such as 0x2909")
    min_branch = entry.get("min_branch")
    if min_branch is not None and not isinstance(min_branch, int):
        raise ValueError(f"{where}: min_branch must be a branch number")
    releases = entry.get("min_release", {})
    if not isinstance(releases, dict) or not all(
            is_version(v) and str(version_major(v)) == b for b, v in releases.items()):
        raise ValueError(f"{where}: min_release maps each branch to one of its releases")
    fails = entry.get("fails_branches", [])
    if not isinstance(fails, list) or not all(isinstance(b, int) for b in fails):
        raise ValueError(f"{where}: fails_branches must list branch numbers")
    if min_branch is None and not releases and not fails:
        raise ValueError(f"{where}: asks nothing (min_branch, min_release or fails_branches)")
    return Floor(
        id=entry["id"], why=entry["why"], source=entry["source"],
        kernel_from=kernel_from, kernel_before=kernel_before,
        os=_text(where, when, "os"), os_version=_text(where, when, "os_version"),
        flavour=flavour, gpu=int(gpu, 16) if gpu is not None else None,
        min_branch=min_branch,
        min_release=tuple(sorted((int(b), v) for b, v in releases.items())),
        fails_branches=tuple(fails),
    )


def _kernel(where: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    numbers = kernel_numbers(value) if isinstance(value, str) else None
    if numbers is None or not re.fullmatch(r"(?a)\d+\.\d+(\.\d+)?", value):
        raise ValueError(f"{where}: kernel {value!r} is not a kernel version such as 6.12.107")
    return numbers


def _text(where: str, when: dict[str, Any], key: str) -> str | None:
    value = when.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{where}: {key} must be a non-empty string")
    return value
