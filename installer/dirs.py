"""Local directories the installer owns: removing a tree, a scratch directory emptied before and
after use, and building one under a staging name that replaces the real one in a single rename,
with its `.complete` marker.

These directories sit in the install dir's cache, which GPU pods mount: each is reached from
`within` (the directory the caller trusts: the install dir, or the cache when it is elsewhere;
default the path's own parent) without following a link (installer/safefs.py), so a planted
`cache` link never makes a scratch step empty another directory (PlantedLink instead)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from installer import safefs

# Written last into a staged directory: a directory without it was never finished.
COMPLETE_MARKER = ".complete"


def remove_tree(path: Path, *, within: Path | None = None) -> None:
    """Remove a file, a symlink (never its target) or a directory tree; nothing when absent.
    Raises PlantedLink when a directory between `within` and `path` is a link."""
    safefs.remove_tree(path, anchor=within)


def mark_complete(directory: Path, text: str, marker: str = COMPLETE_MARKER, *,
                  within: Path | None = None) -> None:
    """The marker that says `directory` is whole (what it holds, in `text`); a link in its
    place is refused (PlantedLink)."""
    safefs.write_atomic(directory / marker, text,
                        anchor=within if within is not None else directory)


def is_complete(directory: Path, marker: str = COMPLETE_MARKER, *,
                within: Path | None = None) -> bool:
    """Whether the marker is a regular file there (a link counts as no marker)."""
    return safefs.is_file(directory / marker, anchor=within)


@contextlib.contextmanager
def scratch(path: Path, *, within: Path | None = None) -> Iterator[Path]:
    """`path` emptied before and after the block: what a killed or failed command left there
    never stays (its caller holds the host lock, so this run is its only user). Raises
    PlantedLink when a directory from `within` down to `path` is a link."""
    anchor = within if within is not None else path.parent
    remove_tree(path, within=anchor)
    safefs.make_dirs(path, anchor=anchor)
    try:
        yield path
    finally:
        remove_tree(path, within=anchor)


@contextlib.contextmanager
def staged_dir(final: Path, *, suffix: str = ".tmp", create: bool = True,
               within: Path | None = None) -> Iterator[Path]:
    """Yield `.<name><suffix>` beside `final` to fill (created empty unless `create` is False,
    for a tool that makes it); when the block ends without error it replaces `final` in one
    rename. On an error the staging directory is removed and `final` is as it was, so a killed
    or failed run never leaves a half-filled `final`. Raises PlantedLink when a directory from
    `within` down to `final` is a link."""
    anchor = within if within is not None else final.parent
    staging = final.with_name(f".{final.name}{suffix}")
    remove_tree(staging, within=anchor)
    safefs.make_dirs(staging if create else staging.parent, anchor=anchor)
    try:
        yield staging
        remove_tree(final, within=anchor)
        safefs.rename(staging, final, anchor=anchor)
    finally:
        remove_tree(staging, within=anchor)
