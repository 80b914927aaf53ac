"""NVIDIA's redist trees (NVIDIA_FABRICMANAGER_REDIST and its mirrors), for every archive they
hold: a component's entry in redistrib_<version>.json, looked up under every base with a
trusted origin's JSON preferred, and the archive it names fetched through installer/delivery
under the trust rules (a pin or the digests file, or that JSON over TLS from a trusted origin
at every hop; a mirror's JSON only says where the archive lies)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, NamedTuple

from installer.config import Config
from installer.errors import (
    DownloadForbidden,
    DownloadNotFound,
    InstallerError,
    UnverifiedDownload,
)
from installer.layout import Layout

if TYPE_CHECKING:
    from installer.delivery import Fetched

log = logging.getLogger(__name__)

# NVIDIA's redist names for the architectures (aarch64 servers are "sbsa").
PLATFORMS = {"x86_64": "linux-x86_64", "aarch64": "linux-sbsa"}
_SHA256 = r"^[0-9a-f]{64}$"
_LISTING_BYTES = 4 << 20


class Listed(NamedTuple):
    """An archive as a redistrib JSON lists it, or as a pinned version names it (no sha256 and
    no size: those come from the pin or the digests file)."""

    version: str
    relative_path: str
    sha256: str | None
    size: int | None
    where: str  # what named it, for messages: the JSON (redacted) or the setting
    # Fetched over TLS from an origin in NVIDIA_DRIVER_TRUSTED_ORIGINS at every hop: its sha256
    # vouches. A mirror's JSON only says where the archive lies.
    trusted: bool = False

    @property
    def name(self) -> str:
        return PurePosixPath(self.relative_path).name


def archive_name(key: str, version: str, arch: str) -> str:
    """How NVIDIA names a component's archive in its redist trees."""
    return f"{key}-{PLATFORMS[arch]}-{version}-archive.tar.xz"


def manifest_url(base: str, version: str) -> str:
    return f"{base.rstrip('/')}/redistrib_{version}.json"


def urls(bases: Sequence[str], relative_path: str) -> list[str]:
    """The archive under every base (mirrors hold NVIDIA's layout)."""
    return [f"{base.rstrip('/')}/{relative_path}" for base in bases]


def download_settings(config: Config) -> Any:
    from installer.release import download

    return download.download_settings(config)


def parse(data: bytes, key: str, arch: str, where: str, *, absent: type[InstallerError],
          mismatch: type[InstallerError], archive: Callable[[str, PurePosixPath], str | None],
          version: str | None = None, because: str = "") -> Listed:
    """The `key` entry for `arch` of a redistrib JSON (`where`, for messages), checked: of
    `version` when one is asked (`because`: why, for the message), a path inside the tree that
    `archive(its version, path)` accepts (it says what the archive must be otherwise, else
    None), a valid sha256 and size. Raises `absent` (no entry for `arch`) or `mismatch` (not
    JSON, or an entry that is not a well-formed archive of the version)."""
    try:
        document: Any = json.loads(data)
    except ValueError as exc:
        raise mismatch(f"{where} is not JSON: {exc}") from None
    entry = document.get(key) if isinstance(document, dict) else None
    platform = PLATFORMS[arch]
    if not isinstance(entry, dict) or not isinstance(entry.get(platform), dict):
        raise absent(f"{where} lists no {key} archive for {platform}")
    if version is not None and entry.get("version") != version:
        raise mismatch(f"{where} lists {key} {entry.get('version')!r}, not {version}{because}")
    listed = str(entry.get("version", ""))
    item = entry[platform]
    relative = str(item.get("relative_path", ""))
    path = PurePosixPath(relative)
    wanted = archive(listed, path)
    if path.is_absolute() or ".." in path.parts or wanted is not None:
        raise mismatch(f"{where}: {key} {listed!r} for {platform} names {relative!r}, not "
                       f"{wanted or 'a path inside the tree'}")
    sha256 = str(item.get("sha256", "")).lower()
    size = str(item.get("size", ""))
    if not re.match(_SHA256, sha256) or not size.isdigit():
        raise mismatch(f"{where}: {key} for {platform} has no valid sha256 and size")
    return Listed(listed, relative, sha256, int(size), where)


class Lookup(NamedTuple):
    listed: Listed | None  # None: no base lists it
    tried: str  # each base passed over, and why
    passed_over: tuple[InstallerError, ...]  # what `read` raised of the bases passed over


def lookup(config: Config, version: str, read: Callable[[bytes, str], Listed], *,
           need_trusted: bool = True,
           pass_over: tuple[type[InstallerError], ...] = ()) -> Lookup:
    """redistrib_<version>.json under the bases of NVIDIA_FABRICMANAGER_REDIST in order, each
    read by `read(data, where)`: the first listing, replaced by the first one a trusted origin
    vouches for (with `need_trusted`; a base not on a trusted origin is not asked once one is
    found). A base whose JSON is not there (404, 403), or whose listing raises one of
    `pass_over` (a mirror may lag or list another release), is passed over; the download
    errors of a base that fails otherwise, and what `read` raises otherwise, are raised."""
    from installer import delivery
    from installer.delivery import digests

    settings = download_settings(config)
    tried: list[str] = []
    passed: list[InstallerError] = []
    found: Listed | None = None
    for base in config.fabricmanager_redist:
        url = manifest_url(base, version)
        if found is not None and not digests.is_trusted(url, config.trusted_origins):
            continue
        where = delivery.redact_url(url)
        try:
            # Trusted only where every hop was: a redirect off the trusted origins vouches for
            # nothing.
            data, trusted = delivery.fetch_listing(url, settings, max_bytes=_LISTING_BYTES)
        except (DownloadNotFound, DownloadForbidden) as exc:
            tried.append(f"{where} ({exc.message.rsplit(': ', 1)[-1]})")
            continue
        try:
            listed = read(data, where)._replace(trusted=trusted)
        except pass_over as exc:
            tried.append(exc.message)
            passed.append(exc)
            continue
        if found is None or trusted:
            found = listed
        if trusted or not need_trusted:
            break
    return Lookup(found, "; ".join(tried), tuple(passed))


def fetch(config: Config, layout: Layout, listed: Listed, bases: Sequence[str], *,
          sha256: str | None = None) -> Fetched:
    """The archive `listed` names, from the first of `bases` that serves it, into the download
    cache: verified against the pin `sha256`, the digests file, or the SHA-256 of a JSON a
    trusted origin vouched for (a cached copy they vouch for is used without a download).
    Raises UnverifiedDownload when nothing vouches for a JSON's listing (before any archive
    byte is fetched); a pinned version's archive without a pin or a digests entry is
    refused by delivery alike."""
    from installer import delivery
    from installer.delivery import Expected, digests

    name = listed.name
    vouched = None
    if listed.sha256 is not None:
        local = sha256 or digests.listed_in(config.digests_file, name)
        if listed.trusted:
            vouched = Expected(listed.sha256, "trusted-origin", f"listed in {listed.where}",
                               listed.size)
        elif local is None and config.allow_unverified:
            log.warning("UNVERIFIED: NVIDIA_DRIVER_ALLOW_UNVERIFIED=true: %s is checked only "
                        "against %s, which no trusted origin vouches for", name, listed.where)
            vouched = Expected(listed.sha256, "none", f"listed in {listed.where}", listed.size)
        elif local is None:
            raise UnverifiedDownload(
                f"{name}: nothing vouches for its SHA-256: it is not in a digests file "
                f"(NVIDIA_DRIVER_DIGESTS_FILE) and {listed.where} is not https on a trusted "
                "origin (NVIDIA_DRIVER_TRUSTED_ORIGINS); a mirror's redistrib JSON vouches for "
                "nothing; refusing to download it")
    # No published .sha256sum beside these archives: only a pin, the digests file or a trusted
    # JSON vouch (an empty list asks no checksum URL).
    return delivery.fetch_file(urls(bases, listed.relative_path), layout.downloads, name,
                               within=layout.cache_anchor, sha256=sha256, checksum_urls=[],
                               settings=download_settings(config), vouched=vouched)
