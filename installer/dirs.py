"""Local directories the installer owns: removing a tree, a scratch directory emptied before and
after use, and building one under a staging name that replaces the real one in a single rename,
with its `.complete` marker."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

# Written last into a staged directory: a directory without it was never finished.
COMPLETE_MARKER = ".complete"


def remove_tree(path: Path) -> None:
    """Remove a file, a symlink (never its target) or a directory tree; nothing when absent."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def mark_complete(directory: Path, text: str, marker: str = COMPLETE_MARKER) -> None:
    """The marker that says `directory` is whole (what it holds, in `text`)."""
    (directory / marker).write_text(text)


def is_complete(directory: Path, marker: str = COMPLETE_MARKER) -> bool:
    return (directory / marker).is_file()


@contextlib.contextmanager
def scratch(path: Path) -> Iterator[Path]:
    """`path` emptied before and after the block: what a killed or failed command left there
    never stays (its caller holds the host lock, so this run is its only user)."""
    remove_tree(path)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        remove_tree(path)


@contextlib.contextmanager
def staged_dir(final: Path, *, suffix: str = ".tmp", create: bool = True) -> Iterator[Path]:
    """Yield `.<name><suffix>` beside `final` to fill (created empty unless `create` is False,
    for a tool that makes it); when the block ends without error it replaces `final` in one
    rename. On an error the staging directory is removed and `final` is as it was, so a killed
    or failed run never leaves a half-filled `final`."""
    staging = final.with_name(f".{final.name}{suffix}")
    remove_tree(staging)
    if create:
        staging.mkdir(parents=True)
    else:
        staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield staging
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_tree(final)
        os.replace(staging, final)
    finally:
        remove_tree(staging)
