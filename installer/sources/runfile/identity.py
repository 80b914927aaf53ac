"""What a .run, its extracted tree and a built module say they are
(reference/nvidia-runfile.md): the header's label and version line, nvidia-installer's version,
the tree's marker, a module's MODULE_VERSION."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

HEADER_BYTES = 64 << 10
_LABEL_LINE = rb'(?m)^label="[^"\n]*Linux-(?P<arch>[A-Za-z0-9_]+) (?P<version>[^"\s]+)"$'
_VERSION_LINE = rb'(?m)^version="?(?P<version>[^"\s]*)"?$'
_INSTALLER_VERSION = r"nvidia-installer:\s+version\s+(\S+)"


class HeaderIdentity(NamedTuple):
    """What the .run's shell header names: its label's arch and version, its version line."""

    label_arch: str | None
    label_version: str | None
    version_line: str | None


def header_identity(runfile: Path) -> HeaderIdentity:
    with runfile.open("rb") as handle:
        head = handle.read(HEADER_BYTES)
    label = re.search(_LABEL_LINE, head)
    version = re.search(_VERSION_LINE, head)
    return HeaderIdentity(
        label.group("arch").decode("ascii", "replace") if label else None,
        label.group("version").decode("ascii", "replace") if label else None,
        version.group("version").decode("ascii", "replace") if version else None,
    )


def archive_problems(header: HeaderIdentity, version: str, arch: str) -> list[str]:
    """How the archive's makeself header, read as text, differs from the planned version and
    arch (empty: none). Nothing of the archive is run to find out."""
    problems = []
    if header.label_version is None:
        problems.append("its header has no NVIDIA driver label")
    else:
        if header.label_version != version:
            problems.append(f"its label names version {header.label_version}")
        if header.label_arch != arch:
            problems.append(f"its label names architecture {header.label_arch}")
    if header.version_line is not None and header.version_line != version:
        problems.append(f"its header's version line says {header.version_line}")
    return problems


def tree_problems(directory: Path, installer_says: str, version: str) -> list[str]:
    """How an extracted tree differs from `version` (empty: none)."""
    problems = []
    found = re.search(_INSTALLER_VERSION, installer_says)
    if found is None or found.group(1) != version:
        said = found.group(1) if found else "no version"
        problems.append(f"its nvidia-installer --version says {said}")
    if not (directory / f"libnvidia-ml.so.{version}").is_file():
        problems.append(f"it has no libnvidia-ml.so.{version}")
    return problems


def manifest_problems(directory: Path, version: str) -> list[str]:
    """How an extracted tree's `.manifest` (its second line is the version) differs from
    `version`, for a tree whose nvidia-installer cannot run here (another architecture's)."""
    try:
        lines = (directory / ".manifest").read_text(errors="replace").splitlines()
    except OSError:
        return ["it has no .manifest"]
    said = lines[1].strip() if len(lines) > 1 else "no version"
    return [] if said == version else [f"its .manifest names version {said}"]
