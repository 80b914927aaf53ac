"""A per-machine cache of built archives: each entry appears atomically or not at all."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
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


def mmdebstrap_tarball(target: Path, argv: list[str], *, stale: str, timeout: float) -> float:
    """`target` made by `mmdebstrap <argv...> <partial>` unless it is there; the seconds it took.

    The tarball is written under a name of this process and renamed into place, so a run killed
    midway (CI's time limit) leaves no half tarball under the final name; what such runs left
    (`<name>.<pid>.partial` of a process that is gone) and the tarballs of other keys (`stale`,
    a glob beside `target`) are removed, so the disk does not fill run after run.
    """
    if target.is_file():
        return 0.0
    target.parent.mkdir(parents=True, exist_ok=True)
    for partial in target.parent.glob("*.partial"):
        pid = partial.suffixes[-2].lstrip(".") if len(partial.suffixes) >= 2 else ""
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            partial.unlink(missing_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    started = time.monotonic()
    try:
        done = subprocess.run(["mmdebstrap", "--quiet", *argv[:-1], str(partial), argv[-1]],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"mmdebstrap of {target.name} failed ({done.returncode}):\n"
                               f"{done.stderr[-3000:]}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    for other in target.parent.glob(stale):
        if other != target:
            other.unlink(missing_ok=True)
    return time.monotonic() - started
