"""The download cache: a record beside each verified file, found again without hashing."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any, cast, get_args

from installer import safefs
from installer.delivery.checksums import normalize_pin
from installer.delivery.part import CHUNK_SIZE, raise_write_error
from installer.delivery.settings import Fetched, VerifiedBy
from installer.errors import HostLayoutError, PlantedLink
from installer.hostroot import write_atomic

log = logging.getLogger("installer.download")

RECORD_SUFFIX = ".download.json"


def record_path(dest: Path) -> Path:
    return dest.with_name(dest.name + RECORD_SUFFIX)


def write_record(dest: Path, sha256: str, source: str, verified_by: VerifiedBy) -> None:
    record = {
        "filename": dest.name,
        "size": dest.stat().st_size,
        "sha256": sha256,
        "source": source,
        "verified_by": verified_by,
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        write_atomic(record_path(dest), json.dumps(record, indent=1) + "\n")
        fd = os.open(dest.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise_write_error(exc, record_path(dest))


def read_record(dest: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(safefs.read_bytes(record_path(dest)))
    except (OSError, ValueError, PlantedLink):  # a link is no record
        return None
    if not isinstance(record, dict):
        return None
    if not isinstance(record.get("size"), int) or not isinstance(record.get("sha256"), str):
        return None
    return record


def find_cached(dest_dir: Path, filename: str, *, sha256: str | None = None) -> Fetched | None:
    """A file fetched earlier into `dest_dir`, if its record still matches; read-only, no I/O
    beyond two stat/read calls (no hashing), so a plan probe can use it."""
    dest = dest_dir / filename
    record = read_record(dest)
    if record is None:
        return None
    try:
        info = os.lstat(dest)  # a link in the cache is never a cached file
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size != record["size"]:
        return None
    pin = normalize_pin(sha256) if sha256 else None
    if pin is not None and pin != record["sha256"].lower():
        return None
    verified = record.get("verified_by")
    verified_by = cast(VerifiedBy, verified if verified in get_args(VerifiedBy) else "none")
    return Fetched(dest, record["sha256"], str(record.get("source", "")), 0, True, verified_by)


def reuse(dest: Path, pin: str | None, verified_by: VerifiedBy = "pin") -> Fetched | None:
    """The cached file when its record matches `pin` (any record without one: the caller
    decides whether its verified_by still counts); a file placed by hand is hashed against
    `pin` and recorded as `verified_by`."""
    cached = find_cached(dest.parent, dest.name, sha256=pin)
    if cached is not None:
        _private(dest)
        return cached
    if not dest.exists():
        return None
    if pin is not None and read_record(dest) is None and safefs.is_file(dest):
        # A file placed by hand (or left by a crash before its record was written): hash it.
        digest = hashlib.sha256()
        try:
            with dest.open("rb") as handle:
                for block in iter(lambda: handle.read(CHUNK_SIZE), b""):
                    digest.update(block)
        except OSError as exc:
            raise HostLayoutError(f"cannot read {dest}: {exc.strerror or exc}") from None
        if digest.hexdigest() == pin:
            _private(dest)
            write_record(dest, pin, "already present", verified_by)
            return Fetched(dest, pin, "already present", 0, True, verified_by)
    log.info(
        "%s in %s does not match its record or the pin; fetching it again", dest.name, dest.parent
    )
    # Drop only the record: the file stays until a verified download replaces it atomically,
    # so a failed download never costs an operator a file they placed there.
    try:
        record_path(dest).unlink(missing_ok=True)
    except OSError as exc:
        raise HostLayoutError(f"cannot replace {dest}: {exc.strerror or exc}") from None
    return None




def _private(path: Path) -> None:
    """Cached files stay readable by root only (the install dir is mounted into GPU pods);
    files cached by older installers were world-readable."""
    try:
        info = os.lstat(path)  # a link's target is never chmodded
        if stat.S_ISREG(info.st_mode) and info.st_mode & 0o077:
            os.chmod(path, 0o600)
    except OSError as exc:
        raise HostLayoutError(f"cannot restrict access to {path}: {exc.strerror or exc}") from None
