"""Who may vouch for a file's SHA-256: the pin, the operator's digests file, or a checksum
file fetched over TLS from an origin the operator trusts. A mirror serves bytes only."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from installer.delivery.cache import find_cached
from installer.delivery.checksums import Expected, normalize_pin, parse_sha256sum
from installer.delivery.digests import every_hop_trusted, is_trusted, listed_in
from installer.delivery.settings import DownloadSettings, Fetched
from installer.delivery.small import fetch_body
from installer.delivery.transport import Http
from installer.delivery.urls import redact_url, scheme_of
from installer.errors import DownloadFailed, DownloadForbidden, DownloadNotFound

log = logging.getLogger("installer.download")


def vouched_locally(filename: str, pin: str | None,
                    settings: DownloadSettings) -> Expected | None:
    """The digest the operator gave for `filename`: the pin, else its digests-file entry (read
    now; no network). Raises DigestsFileInvalid."""
    if pin is not None:
        return Expected(pin, "pin", "the pinned value")
    listed = listed_in(settings.digests_file, filename)
    if listed is not None:
        return Expected(listed.sha256, "digests-file", f"listed in {settings.digests_file}",
                        listed.size)
    return None


def published(
    checksum_urls: Sequence[str],
    name: str,
    settings: DownloadSettings,
    http: Http,
    *,
    next_source: bool = False,
) -> Expected | None:
    """The digest a trusted origin publishes for the file over TLS, or None when none does
    (404, refused, or no URL on a trusted origin: a mirror's checksum file is never asked).
    A file:// checksum file is the operator's own, as a file:// source is."""
    for url in checksum_urls:
        red = redact_url(url)
        local = scheme_of(url) == "file"
        if not local and not is_trusted(url, settings.trusted_origins):
            log.info("not asking %s for a checksum: not https on a trusted origin "
                     "(NVIDIA_DRIVER_TRUSTED_ORIGINS)", red)
            continue
        try:
            body = fetch_body(
                url, settings, max_bytes=1 << 20, _http=http, _next_source=next_source,
                https_only=not local,
            )
        except (DownloadNotFound, DownloadForbidden) as exc:
            # S3 answers 403, not 404, for a missing key when listing is not allowed.
            log.info("no checksum file at %s (%s)", red, exc.message.rsplit(": ", 1)[-1])
            continue
        if not local and not every_hop_trusted(body.hops, settings.trusted_origins):
            elsewhere = next(h for h in body.hops
                             if not is_trusted(h, settings.trusted_origins))
            log.warning("the checksum file %s was redirected to %s, not a trusted origin "
                        "(NVIDIA_DRIVER_TRUSTED_ORIGINS): it vouches for nothing", red,
                        redact_url(elsewhere))
            continue
        digest = parse_sha256sum(body.data.decode("utf-8", "replace"), name)
        if digest is None:
            raise DownloadFailed(f"{red}: no SHA-256 for {name} in the checksum file")
        return Expected(digest, "local-sha256sum" if local else "trusted-origin",
                        f"published in {red}")
    return None


def still_vouched(cached: Fetched, settings: DownloadSettings) -> bool:
    """A cached file no pin or digests-file entry matches now: its record counts when this
    installer verified it against the operator's word or a trusted origin when it was fetched
    (`installer download --dest <cache>` prefetches so), or it copies the operator's own
    file:// source. A checksum a mirror published (records of older installers) or none at all
    counts only while unverified files are allowed."""
    return (cached.verified_by in ("pin", "digests-file", "trusted-origin", "local-sha256sum")
            or cached.source.startswith("file:")
            or (settings.allow_unverified
                and cached.verified_by in ("none", "published-sha256sum")))


def find_vouched(dest_dir: Path, filename: str, pin: str | None,
                 settings: DownloadSettings) -> Fetched | None:
    """The cached file fetch_file would reuse (read-only, no network, no hashing: a plan probe
    may call it), labelled with what vouches for it, or None. Raises DigestsFileInvalid."""
    expected = vouched_locally(filename, normalize_pin(pin) if pin else None, settings)
    cached = find_cached(dest_dir, filename, sha256=expected.sha256 if expected else None)
    if cached is None:
        return None
    if expected is not None:
        return replace(cached, verified_by=expected.verified_by)
    return cached if still_vouched(cached, settings) else None


def fetch_listing(url: str, settings: DownloadSettings, *, max_bytes: int) -> tuple[bytes, bool]:
    """A small file that may vouch (a redistrib JSON) and whether it does: it came over TLS
    from a trusted origin at every hop. A URL on a trusted origin must stay https through
    every redirect (DownloadFailed otherwise); one that redirects to another https host is
    read as a mirror's, vouching for nothing. Raises the errors of fetch_bytes."""
    first = is_trusted(url, settings.trusted_origins)
    body = fetch_body(url, settings, max_bytes=max_bytes, https_only=first)
    trusted = first and every_hop_trusted(body.hops, settings.trusted_origins)
    if first and not trusted:
        log.warning("%s was redirected off the trusted origins (%s): what it lists vouches "
                    "for nothing", redact_url(url), " -> ".join(redact_url(h) for h in body.hops))
    return body.data, trusted
