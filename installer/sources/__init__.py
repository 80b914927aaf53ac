"""The ways a driver reaches the host: one `Source` per way, registered in SOURCES."""

from __future__ import annotations

from typing import TYPE_CHECKING

from installer.sources.dnf.source import DnfSource
from installer.sources.runfile.source import RunfileSource
from installer.sources.source import Groundwork, Source

if TYPE_CHECKING:
    from installer.host import Distro

__all__ = [
    "SOURCES",
    "Groundwork",
    "Source",
    "find",
    "installed",
    "module_builder",
    "named",
    "names",
    "passed_over",
    "prebuilt",
    "recorded",
    "runfile",
]

# One line per source; under `auto` the first with evidence wins, else the module builder.
SOURCES: tuple[Source, ...] = (
    RunfileSource(),
    DnfSource(),
)


def names() -> tuple[str, ...]:
    return tuple(source.name for source in SOURCES)


def find(name: str) -> Source | None:
    return next((source for source in SOURCES if source.name == name), None)


def named(name: str) -> Source:
    """The registered source called `name`. Raises KeyError for any other name."""
    found = find(name)
    if found is None:
        raise KeyError(f"no source named {name!r} (known: {', '.join(names())})")
    return found


def passed_over(chosen: Source, distro: Distro) -> list[str]:
    """Why `auto` passed over each other source offered on `distro` (for `chosen`'s reason)."""
    return [s.passed_over() for s in SOURCES if s is not chosen and s.offered(distro)]


def module_builder() -> Source:
    """The source that builds modules into the cache for any kernel (prebuild, next kernel)."""
    return next(source for source in SOURCES if source.builds_modules)


def recorded(name: str) -> Source:
    """The source an install record names; a record older than the registry counts as the
    module builder's."""
    return find(name) or module_builder()
