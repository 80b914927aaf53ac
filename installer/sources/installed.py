"""What NVIDIA's .run leaves on the host, as both the runfile and the prebuilt source probe it:
an extracted tree, the modules built in the cache, the user space in versions/<ver> and the
listing of what that user space holds. Read-only probes and the listing's file, nothing else (so
neither source room imports the other's internals)."""

from __future__ import annotations

import json
import mmap
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from installer.dirs import is_complete

if TYPE_CHECKING:
    from installer.plan import Context

EXTRACTED_MARKER = ".extracted"
LISTING = ".userspace-files"  # in versions/<ver>: the paths install-userspace placed


def extracted_marker(version: str, runfile_sha256: str) -> str:
    """What the extracted tree's marker holds: the version, then the SHA-256 of the .run it
    came from, which the current rules vouched for before it was extracted."""
    return f"{version}\n{runfile_sha256}\n"


def is_extracted(directory: Path, version: str) -> bool:
    """A whole tree of `version`: its marker names the version and the digest of the .run it
    came from, and its own files name the version. A marker of the version alone is an older
    installer's, which took a .run on a mirror's own checksum: that tree is extracted anew."""
    marker = directory / EXTRACTED_MARKER
    try:
        text = marker.read_text()
    except OSError:
        return False
    return (
        re.fullmatch(re.escape(version) + r"\n[0-9a-f]{64}\n", text) is not None
        and (directory / "nvidia-installer").is_file()
        and (directory / f"libnvidia-ml.so.{version}").is_file()
    )


def module_version_matches(ko: Path, version: str) -> bool:
    """The module's .modinfo names `version` (MODULE_VERSION), read without running modinfo."""
    try:
        with ko.open("rb") as handle, mmap.mmap(handle.fileno(), 0,
                                                access=mmap.ACCESS_READ) as data:
            return data.find(b"\0version=" + version.encode() + b"\0") >= 0
    except (OSError, ValueError):
        return False


def modules_built(ctx: Context) -> bool:
    """The planned modules are in the build cache, complete and of the planned version."""
    t = ctx.target
    build = ctx.layout.module_build(t.version, t.kernel, t.flavour)
    # A marker alone is not trusted: the module itself must be of the planned version.
    return is_complete(build) and module_version_matches(build / "nvidia.ko", t.version)


def userspace_installed(ctx: Context) -> bool:
    """versions/<ver> holds the planned version's user space, complete."""
    version = ctx.target.version
    final = ctx.layout.version_dir(version)
    return is_complete(final) and (
        final / "lib64" / f"libnvidia-ml.so.{version}").is_file()


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
