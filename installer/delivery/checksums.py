"""SHA-256 values: pins, `sha256sum` files, and what a file is expected to hash to."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from installer.delivery.settings import VerifiedBy
from installer.errors import ConfigError

CHECKSUM_SUFFIX = ".sha256sum"


@dataclass(frozen=True)
class Expected:
    """What a file must hash to, who said so (`origin`: safe to log), and its size if known."""

    sha256: str
    verified_by: VerifiedBy
    origin: str
    size: Optional[int] = None


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_sha256_hex(text: str) -> bool:
    """64 lowercase hex digits: a SHA-256 as sha256sum, pins and OCI digests write it."""
    return _SHA256_HEX.fullmatch(text) is not None


def parse_sha256sum(text: str, name: str) -> str | None:
    """The digest for `name` in `sha256sum` output (`<hex>  <name>`), or the only digest there."""
    digests: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(None, 1)
        digest = fields[0].lower()
        if not is_sha256_hex(digest):
            continue
        listed = fields[1].strip().lstrip("*") if len(fields) > 1 else ""
        if listed and (listed == name or listed.rsplit("/", 1)[-1] == name):
            return digest
        digests.append(digest)
    return digests[0] if len(digests) == 1 else None


def normalize_pin(sha256: str) -> str:
    pin = sha256.strip().lower()
    if pin.startswith("sha256:"):
        pin = pin[len("sha256:") :]
    if not is_sha256_hex(pin):
        raise ConfigError(f"the pinned SHA-256 {sha256!r} is not 64 hexadecimal digits")
    return pin


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file on disk, read in 1 MiB blocks. Raises OSError."""
    import hashlib  # the warm path hashes nothing

    hashed = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            hashed.update(block)
    return hashed.hexdigest()
