"""The listing of the user-space files install-userspace placed in versions/<ver>: what a
registry artifact of this user space holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

LISTING = ".userspace-files"  # in versions/<ver>: the paths install-userspace placed


def write_listing(tree: Path) -> None:
    """Record every path below `tree` (none of the installer's own dot-files at its top)."""
    paths = []
    for directory, dirs, files in os.walk(tree):
        rel = os.path.relpath(directory, tree)
        for name in dirs + files:
            path = name if rel == "." else f"{rel}/{name}"
            if not (rel == "." and name.startswith(".")):
                paths.append(path)
    (tree / LISTING).write_text(json.dumps(sorted(paths), indent=0) + "\n")


def read_listing(tree: Path) -> list[str] | None:
    try:
        paths = json.loads((tree / LISTING).read_text())
    except (OSError, ValueError):
        return None
    return [str(p) for p in paths] if isinstance(paths, list) else None
