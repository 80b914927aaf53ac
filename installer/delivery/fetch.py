"""fetch_file: mirrors in order, one source at a time, verify, rename into place."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Optional

from installer import safefs
from installer.delivery.cache import RECORD_SUFFIX, reuse, write_record
from installer.delivery.checksums import (
    CHECKSUM_SUFFIX,
    Expected,
    normalize_pin,
)
from installer.delivery.part import (
    PART_SUFFIX,
    Part,
    check_space,
    pump,
    raise_write_error,
)
from installer.delivery.progress import Progress
from installer.delivery.retry import backoff_delay, with_retries
from installer.delivery.settings import DownloadSettings, Fetched, VerifiedBy
from installer.delivery.transport import (
    Http,
    Transient,
    Unreachable,
    body_readinto,
    raise_for_status,
    read_errors,
    reason_of,
)
from installer.delivery.urls import local_path, open_local, redact_url, remote_name, scheme_of
from installer.delivery.vouch import published, still_vouched, vouched_locally
from installer.errors import (
    ChecksumMismatch,
    DownloadFailed,
    DownloadForbidden,
    DownloadNotFound,
    DownloadTooLarge,
    HostLayoutError,
    UnverifiedDownload,
)

log = logging.getLogger("installer.download")
_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


class _TooLarge(Exception):
    """More bytes than the file may have: not worth a retry from this source."""


def _capped(readinto: Callable[[memoryview], int], part: Part,
            limit: int) -> Callable[[memoryview], int]:
    """`readinto` that reads at most one byte past `limit` (counting what the part holds) and
    raises _TooLarge once the body goes beyond it: an endless body stops there."""
    start = part.size
    got = 0

    def read(view: memoryview) -> int:
        nonlocal got
        room = limit - start - got
        n = readinto(view[: max(room + 1, 1)] if room + 1 < len(view) else view)
        got += n
        if start + got > limit:
            raise _TooLarge(f"the body goes on past {limit} bytes")
        return n

    return read


def _http_attempt(
    http: Http, url: str, part: Part, label: str, settings: DownloadSettings, limit: int
) -> None:
    part.sync()
    red = redact_url(url)
    headers: dict[str, str] = {}
    if part.size:
        headers["Range"] = f"bytes={part.size}-"
    resp = http.get(url, headers)
    with resp:
        status = resp.status_code
        if status == 416:
            log.warning("%s: server refused to resume at byte %d; starting over", red, part.size)
            part.reset()
            raise Transient("HTTP 416 range not satisfiable; restarting from zero")
        raise_for_status(resp, url)
        length_header = resp.headers.get("Content-Length")
        body_length = int(length_header) if length_header and length_header.isdigit() else None
        if status == 206:
            match = _CONTENT_RANGE_RE.match(resp.headers.get("Content-Range", ""))
            if match is None or int(match.group(1)) != part.size:
                part.reset()
                raise Transient(
                    f"HTTP 206 with Content-Range {resp.headers.get('Content-Range')!r} "
                    "that does not start where the partial file ends; restarting from zero"
                )
            total: int | None = (
                int(match.group(3))
                if match.group(3) != "*"
                else (part.size + body_length if body_length is not None else None)
            )
        else:
            if part.size:
                log.info("%s: server ignored the Range request; downloading from the start", red)
                part.reset()
            total = body_length
        if total is not None and total > limit:
            raise _TooLarge(f"the server announces {total} bytes, more than {limit}")
        if total is not None:
            check_space(part.path.parent, total - part.size, label)
        part.sources.add(url)
        progress = Progress(label, total, mode=settings.progress, start=part.size, logger=log)
        errors = read_errors()
        got = pump(_capped(body_readinto(resp), part, limit), part, progress, errors,
                   lambda e: reason_of(e, url))
        if body_length is not None and got < body_length:
            raise Transient(f"short body: {got} of {body_length} bytes")
        if total is not None and part.size != total:
            raise Transient(f"file ended at {part.size} of {total} bytes")
        progress.finish()


def _copy_local(url: str, part: Part, label: str, settings: DownloadSettings,
                limit: int) -> None:
    red = redact_url(url)
    local_path(url)  # a file:// URL that names no local path is refused before the reset
    part.reset()
    src = open_local(url)
    with src:
        total = os.fstat(src.fileno()).st_size
        if total > limit:
            raise _TooLarge(f"the file has {total} bytes, more than {limit}")
        check_space(part.path.parent, total, label)
        part.sources.add(url)
        progress = Progress(label, total, mode=settings.progress, logger=log)
        try:
            pump(_capped(src.readinto, part, limit), part, progress, (OSError,), str)
        except Transient as exc:  # a local read error: retrying will not help
            raise DownloadFailed(f"{red}: {exc}") from None
    if part.size != total:
        raise DownloadFailed(f"{red}: changed while being copied ({part.size} of {total} bytes)")
    progress.finish()


def _fetch_from(
    url: str,
    part: Part,
    dest: Path,
    expected: Expected | None,
    checksum_urls: Sequence[str] | None,
    settings: DownloadSettings,
    http: Http,
) -> Fetched:
    scheme = scheme_of(url)
    red = redact_url(url)
    label = dest.name
    if expected is None and checksum_urls is None:
        expected = published(
            [url + CHECKSUM_SUFFIX], remote_name(url), settings, http, next_source=True
        )
    if expected is None:
        if scheme != "file" and not settings.allow_unverified:
            raise UnverifiedDownload(
                f"{dest.name} from {red}: nothing vouches for its SHA-256 (no pin, no entry in "
                "a digests file, and no checksum file over https from a trusted origin; a "
                "mirror's own checksum file vouches for nothing); refusing to download it"
            )
        if scheme == "file":
            log.warning("no SHA-256 for %s: %s will not be verified", red, dest.name)
        else:
            log.warning("UNVERIFIED: NVIDIA_DRIVER_ALLOW_UNVERIFIED=true: %s from %s is used "
                        "with no SHA-256 anyone vouches for; whoever controls that server "
                        "controls what runs as root", dest.name, red)
    limit = expected.size if expected is not None and expected.size is not None \
        else settings.max_bytes
    log.info("fetching %s from %s", dest.name, red)
    started = time.monotonic()
    received_before = part.received
    for fresh in (False, True):
        try:
            if scheme == "file":
                _copy_local(url, part, label, settings, limit)
            else:
                with_retries(
                    lambda: _http_attempt(http, url, part, label, settings, limit),
                    settings,
                    red,
                    next_source=True,
                )
        except _TooLarge as exc:
            part.remove()
            listed = "its listed size" if limit != settings.max_bytes else "the hard cap"
            raise DownloadTooLarge(
                f"{dest.name} from {red}: {exc} ({listed}); the partial file was removed"
            ) from None
        actual = part.hasher.hexdigest()
        if expected is None or actual == expected.sha256:
            break
        pieces = sorted(redact_url(s) for s in part.sources)
        part.remove()
        if len(pieces) > 1 and not fresh:
            log.warning(
                "%s: SHA-256 mismatch on a file pieced together from %s; downloading it again "
                "from the start",
                dest.name,
                " and ".join(pieces),
            )
            continue
        raise ChecksumMismatch(
            f"{dest.name} from {red}: expected SHA-256 {expected.sha256} "
            f"({expected.origin}), got {actual}"
        )
    try:
        safefs.rename(part.path, dest, anchor=part.anchor)
    except OSError as exc:
        raise_write_error(exc, dest)
    if not part.landed_at(dest):
        # Something swapped another file in for the verified part before the rename.
        safefs.unlink(dest, anchor=part.anchor)
        raise safefs.planted(dest, part.anchor, "a file swapped in for the verified download")
    verified_by: VerifiedBy = expected.verified_by if expected else "none"
    write_record(dest, actual, red, verified_by)
    elapsed = max(time.monotonic() - started, 1e-9)
    moved = part.received - received_before
    log.info(
        "fetched %s from %s: %.1f MB in %.1f s (%.1f MB/s), sha256 %s, verified by %s",
        dest.name,
        red,
        dest.stat().st_size / 1e6,
        elapsed,
        moved / elapsed / 1e6,
        actual,
        verified_by,
    )
    return Fetched(dest, actual, red, part.received, False, verified_by)


def fetch_file(
    urls: Sequence[str],
    dest_dir: Path,
    filename: str,
    *,
    sha256: str | None = None,
    checksum_urls: Sequence[str] | None = None,
    settings: DownloadSettings | None = None,
    vouched: Expected | None = None,
    within: Path | None = None,
) -> Fetched:
    """Make `dest_dir/filename` hold the file served at the first working URL of `urls`.

    The SHA-256 comes from the pin, else the digests file's entry for `filename`, else
    `vouched` (a digest the caller read from a trusted origin), else `checksum_urls` or
    `<url>.sha256sum`, each asked only when it is https on a trusted origin; a source nothing
    vouches for is refused before any byte is fetched (unless settings.allow_unverified, or
    a file:// source). Reuses a file recorded by an earlier call (no network) when what
    vouches now matches its record, or a trusted origin vouched for it. Otherwise streams to
    `<filename>.part` (resuming one left behind, never past the listed size or
    settings.max_bytes), verifies it, renames it into place and writes
    `<filename>.download.json`. Writes only under `dest_dir`, and never through a link
    below `within` (the directory the caller trusts, default `dest_dir` itself: the install
    dir for its cache, which GPU pods mount).

    Raises ChecksumMismatch (the file is deleted; other mirrors are not tried), InsufficientSpace,
    DownloadNotFound / DownloadForbidden (every source answered so), UnverifiedDownload (no
    source is vouched for), DownloadTooLarge, DownloadFailed (otherwise, listing each source's
    last error), HostLayoutError (dest_dir not writable), ConfigError (a malformed pin),
    DigestsFileInvalid, PlantedLink (a link where the cache keeps this file, its record or
    its part: nothing was fetched or written).
    """
    settings = settings or DownloadSettings()
    sources = list(urls)
    if not sources:
        raise ValueError("fetch_file needs at least one URL")
    if not filename or "/" in filename or filename in (".", ".."):
        raise ValueError(f"not a plain file name: {filename!r}")
    pin = normalize_pin(sha256) if sha256 else None
    anchor = within if within is not None else dest_dir
    try:
        safefs.make_dirs(dest_dir, anchor=anchor)
    except OSError as exc:
        raise HostLayoutError(f"cannot create {dest_dir}: {exc.strerror or exc}") from None
    dest = dest_dir / filename
    for name in (filename, filename + PART_SUFFIX, filename + RECORD_SUFFIX):
        safefs.check(dest_dir / name, anchor=anchor)
    expected: Optional[Expected] = vouched_locally(filename, pin, settings) or vouched
    cached = reuse(dest, expected.sha256 if expected else None,
                   expected.verified_by if expected else "pin")
    if cached is not None and (expected is not None or still_vouched(cached, settings)):
        if expected is not None:
            cached = replace(cached, verified_by=expected.verified_by)
        log.info(
            "using %s from the cache (sha256 %s, verified by %s)",
            dest,
            cached.sha256,
            cached.verified_by,
        )
        return cached

    http = Http(settings)
    part = Part(dest_dir / (filename + PART_SUFFIX), keep_cached=settings.keep_cached,
                anchor=anchor)
    try:
        if expected is None and checksum_urls is not None:
            expected = published(list(checksum_urls), filename, settings, http)
        last: dict[str, DownloadFailed] = {}
        pending = sources
        rounds = settings.retries + 1
        for round_no in range(1, rounds + 1):
            unreachable: list[str] = []
            for url in pending:
                try:
                    return _fetch_from(url, part, dest, expected, checksum_urls, settings, http)
                except Unreachable as exc:
                    # A dead mirror costs one failed connect, not a round of backoffs: the
                    # list is retried as a whole below.
                    unreachable.append(url)
                    last[url] = DownloadFailed(
                        f"{redact_url(url)}: {exc} (unreachable in {round_no} of {rounds} rounds)"
                    )
                    log.warning("%s: %s; trying the next source", redact_url(url), exc)
                except DownloadFailed as exc:
                    last[url] = exc
                    if len(sources) > 1:
                        log.warning("source failed: %s", exc.message)
            if not unreachable or round_no == rounds:
                break
            delay = backoff_delay(settings, round_no)
            log.warning(
                "%d of %d sources unreachable; trying them again in %.1f s (round %d of %d)",
                len(unreachable),
                len(sources),
                delay,
                round_no + 1,
                rounds,
            )
            time.sleep(delay)
            pending = unreachable
        raise all_failed([last[url] for url in sources if url in last])
    finally:
        part.close()
        http.close()


def all_failed(failures: list[DownloadFailed]) -> DownloadFailed:
    if len(failures) == 1:
        return failures[0]
    lines = "\n".join(f"  - {exc.message}" for exc in failures)
    message = f"all {len(failures)} sources failed:\n{lines}"
    kinds = {type(exc) for exc in failures}
    if UnverifiedDownload in kinds:
        # What the operator must act on: a source nothing vouches for is never used, however
        # the others failed.
        return UnverifiedDownload(message)
    if len(kinds) == 1 and kinds.pop() in (
        DownloadNotFound,
        DownloadForbidden,
        UnverifiedDownload,
    ):
        return type(failures[0])(message, hint=failures[0].hint)
    return DownloadFailed(message)
