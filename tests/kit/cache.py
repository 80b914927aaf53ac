"""A per-machine cache of built archives: each entry appears atomically or not at all."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

CACHE_ENV = "INSTALLER_KIT_CACHE"


def cache_root() -> Path:
    default = Path(tempfile.gettempdir()) / f"installer-kit-cache-{os.getuid()}"
    return Path(os.environ.get(CACHE_ENV) or default)


def tree_digest(paths: list[Path]) -> str:
    """Hash of file names and contents, so any edit to the kit's inputs makes a new entry."""
    digest = hashlib.sha256()
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts:
                continue
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def cached_dir(key: str, produce: Callable[[Path], None]) -> Path:
    """Return the entry for key, calling produce(tmp_dir) to make it if absent.

    Concurrent builders each work in their own temp dir; the first rename wins and the others
    discard their copy.
    """
    root = cache_root()
    entry = root / key
    if entry.is_dir():
        return entry
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        produce(work)
        os.rename(work, entry)
    except OSError:
        if not entry.is_dir():
            raise
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return entry
