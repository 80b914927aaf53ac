"""The operator's digests file for what a test serves: `<sha256>  <name>  <size>` for every
.run and Fabric Manager archive under the given trees (what `installer download` writes)."""

from __future__ import annotations

import hashlib
from pathlib import Path

SERVED = ("*.run", "*-archive.tar.xz")


def write_digests(out: Path, *trees: Path) -> Path:
    """`out` listing every served file under `trees` by name; a name found twice with other
    bytes is a test's mistake (the installer looks files up by name)."""
    entries: dict[str, str] = {}
    for tree in trees:
        files = [tree] if tree.is_file() else [p for g in SERVED for p in tree.rglob(g)]
        for path in sorted(files):
            data = path.read_bytes()
            line = f"{hashlib.sha256(data).hexdigest()}  {path.name}  {len(data)}\n"
            if entries.setdefault(path.name, line) != line:
                raise ValueError(f"{path.name} is served with two different contents")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(entries[name] for name in sorted(entries)))
    return out
