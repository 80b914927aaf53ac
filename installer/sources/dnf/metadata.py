"""The nvidia-driver module metadata dnf caches (modules.yaml): which versions each stream
offers and which packages, and so which stream and version a transaction will install."""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
from dataclasses import dataclass, field
from pathlib import Path

MODULE = "nvidia-driver"
_NEVRA = re.compile(
    r"^(?P<name>.+)-(?:(?P<epoch>\d+):)?(?P<version>[^-]+)-(?P<release>[^-]+)\.(?P<arch>[^.]+)$"
)
_OPENERS = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}


@dataclass
class Streams:
    """stream -> driver version -> the package names its artifacts list."""

    packages: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def versions(self, stream: str) -> list[str]:
        """Oldest first."""
        return sorted(self.packages.get(stream, {}), key=version_key)

    def has(self, stream: str, version: str, package: str) -> bool:
        return package in self.packages.get(stream, {}).get(version, set())


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def parse(text: str) -> Streams:
    """The nvidia-driver documents of a modules.yaml (modulemd v2): each document's stream and
    its `artifacts: rpms:` NEVRAs. A small reader for that one shape, not a YAML parser."""
    found = Streams()
    for document in re.split(r"^---\s*$", text, flags=re.MULTILINE):
        if not re.search(r"^document:\s*modulemd\s*$", document, re.MULTILINE):
            continue
        name = _field(document, "name")
        stream = _field(document, "stream")
        if name != MODULE or not stream:
            continue
        for nevra in _artifacts(document):
            match = _NEVRA.match(nevra)
            if not match or match["arch"] == "src":
                continue
            versions = found.packages.setdefault(stream, {})
            versions.setdefault(match["version"], set()).add(match["name"])
    # A version counts for a stream only with its user space (nvidia-driver) listed.
    for versions in found.packages.values():
        for version in [v for v, names in versions.items() if MODULE not in names]:
            del versions[version]
    return found


def _field(document: str, key: str) -> str | None:
    match = re.search(rf"^  {key}:\s*['\"]?([^'\"\n]+?)['\"]?\s*$", document, re.MULTILINE)
    return match.group(1) if match else None


def _artifacts(document: str) -> list[str]:
    lines = document.splitlines()
    items: list[str] = []
    for index, line in enumerate(lines):
        if line.strip() != "artifacts:":
            continue
        depth = len(line) - len(line.lstrip())
        in_rpms = False
        for follow in lines[index + 1 :]:
            stripped = follow.strip()
            indent = len(follow) - len(follow.lstrip())
            if stripped and indent <= depth:
                break
            if stripped == "rpms:":
                in_rpms = True
            elif in_rpms and stripped.startswith("- "):
                items.append(stripped[2:].strip().strip("'\""))
            elif stripped.endswith(":"):
                in_rpms = False
    return items


def read_cached(cache_dir: Path) -> Streams | None:
    """The module streams in dnf's metadata cache (every repo's modules.yaml, compressed or
    not), or None when no cached repo has module metadata."""
    files = sorted(cache_dir.glob("*/repodata/*modules.yaml*"))
    if not files:
        return None
    merged = Streams()
    for path in files:
        opener = _OPENERS.get(path.suffix)
        try:
            if opener is not None:
                with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
                    text = handle.read()
            else:
                text = path.read_text(encoding="utf-8")
        except (OSError, EOFError, lzma.LZMAError, ValueError):
            continue
        for stream, versions in parse(text).packages.items():
            for version, names in versions.items():
                merged.packages.setdefault(stream, {}).setdefault(version, set()).update(names)
    return merged
