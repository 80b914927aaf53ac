"""The package's .manifest: description, version, the kernel modules (NVIDIA's manifest names
them too), then one `path mode TYPE [subdir]` line per user-space file."""

from __future__ import annotations

import os
from typing import NamedTuple


class Entry(NamedTuple):
    path: str
    mode: int
    file_type: str
    subdir: str


class Manifest(NamedTuple):
    description: str
    version: str
    kernel_modules: list[str]
    entries: list[Entry]


def load(package_dir: str) -> Manifest:
    with open(os.path.join(package_dir, ".manifest")) as handle:
        lines = handle.read().splitlines()
    entries = []
    for line in lines[3:]:
        parts = line.split()
        if parts:
            subdir = parts[3] if len(parts) > 3 else ""
            entries.append(Entry(parts[0], int(parts[1], 8), parts[2], subdir))
    return Manifest(lines[0], lines[1], lines[2].split(), entries)
