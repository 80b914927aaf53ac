"""The operator's digests file and the trusted origins: plain parsing, no download machinery
(`installer plan` reads them on every run)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from installer.errors import DigestsFileInvalid

# A digests file lists a handful of files; anything larger is not one.
_MAX_DIGESTS_FILE = 1 << 20
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


class Listed(NamedTuple):
    """One file of a digests file: its SHA-256 and, when listed, its size in bytes."""

    sha256: str
    size: int | None


def parse_digests(text: str, where: str) -> dict[str, Listed]:
    """`<sha256>  <file name>  [<size>]` lines (sha256sum's output is valid; `#` comments).

    Raises DigestsFileInvalid naming the line that is not one."""
    entries: dict[str, Listed] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) in (2, 3):
            digest, name = fields[0].lower(), fields[1].lstrip("*")
            size = fields[2] if len(fields) == 3 else None
            if (_SHA256_RE.fullmatch(digest) and _NAME_RE.fullmatch(name)
                    and (size is None or size.isdigit())):
                listed = Listed(digest, int(size) if size is not None else None)
                if entries.get(name, listed) != listed:
                    raise DigestsFileInvalid(f"{where} lists {name} twice with different "
                                             "digests")
                entries[name] = listed
                continue
        raise DigestsFileInvalid(f"{where}, line {number}: {line[:80]!r} is not "
                                 "`<sha256>  <file name>  [<size>]`")
    return entries


def read_digests(path: Path) -> dict[str, Listed]:
    """The operator's digests file (a mounted ConfigMap, say). Raises DigestsFileInvalid."""
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_DIGESTS_FILE + 1)
    except OSError as exc:
        raise DigestsFileInvalid(f"cannot read the digests file {path}: "
                                 f"{exc.strerror or exc}") from None
    if len(data) > _MAX_DIGESTS_FILE:
        raise DigestsFileInvalid(f"the digests file {path} is larger than "
                                 f"{_MAX_DIGESTS_FILE} bytes")
    return parse_digests(data.decode("utf-8", "replace"), str(path))


def listed_in(path: Path | None, name: str) -> Listed | None:
    return read_digests(path).get(name) if path is not None else None


def format_digests(files: dict[str, Listed]) -> str:
    """A digests file for `name -> Listed` entries, sorted by name."""
    lines = [f"{listed.sha256}  {name}" + (f"  {listed.size}" if listed.size is not None else "")
             for name, listed in sorted(files.items())]
    return "".join(line + "\n" for line in lines)


def origin_of(url: str) -> str | None:
    """`https://host[:port]` of an https URL (the default port left out), else None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() != "https" or not parts.hostname:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"https://{host}" + (f":{port}" if port not in (None, 443) else "")


def normalize_origin(origin: str) -> str | None:
    return origin_of(origin.rstrip("/") + "/")


def is_trusted(url: str, origins: Sequence[str]) -> bool:
    """Whether a checksum file at `url` may vouch: https (verified by TLS) from a trusted
    origin. Plain http, file:// and any other host serve bytes only."""
    origin = origin_of(url)
    return origin is not None and origin in {normalize_origin(o) for o in origins}


def every_hop_trusted(hops: Sequence[str], origins: Sequence[str]) -> bool:
    """Whether every URL a fetch went through is https on a trusted origin: a trusted origin
    that redirects elsewhere (an open redirect, a CDN nobody named, even over https) hands the
    answer to a server the operator never trusted, so the bytes vouch for nothing."""
    return bool(hops) and all(is_trusted(hop, origins) for hop in hops)
