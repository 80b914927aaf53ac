"""Small files (catalogs, checksum files) read whole into memory."""

from __future__ import annotations

from typing import NamedTuple

from installer.delivery.part import CHUNK_SIZE
from installer.delivery.retry import with_retries
from installer.delivery.settings import DownloadSettings
from installer.delivery.transport import (
    Http,
    Transient,
    raise_for_status,
    read_errors,
    reason_of,
)
from installer.delivery.urls import open_local, redact_url, scheme_of
from installer.errors import DownloadFailed

DEFAULT_MAX_BYTES = 16 << 20


class Body(NamedTuple):
    """A small file's content and every URL the fetch went through (redirects in order, the
    one that answered last): who sent the bytes is the whole chain, not the first URL."""

    data: bytes
    hops: tuple[str, ...]


def fetch_bytes(url: str, settings: DownloadSettings | None = None, *,
                max_bytes: int = DEFAULT_MAX_BYTES, https_only: bool = False) -> bytes:
    """fetch_body's content alone (see there; its session and source hooks are the vouching
    lookup's, which reads the whole body)."""
    return fetch_body(url, settings, max_bytes=max_bytes, https_only=https_only).data


def fetch_body(
    url: str,
    settings: DownloadSettings | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    _http: Http | None = None,
    _next_source: bool = False,
    https_only: bool = False,
) -> Body:
    """The content of a small file (catalog, checksum file) over http(s) or file://.

    Touches nothing on the host. Raises DownloadNotFound (404/410 or missing file),
    DownloadForbidden (401/403 or unreadable file), DownloadFailed (other failures, retries
    exhausted, or more than `max_bytes`). With `https_only` (a checksum file that vouches, a
    dnf .repo), a URL or redirect that is not https is refused: only TLS says who sent the
    bytes.
    """
    settings = settings or DownloadSettings()
    red = redact_url(url)
    if https_only and scheme_of(url) != "https":
        raise DownloadFailed(
            f"{red}: not https: what decides what runs as root must come over TLS")
    if scheme_of(url) == "file":
        with open_local(url) as handle:
            try:
                data = handle.read(max_bytes + 1)
            except OSError as exc:
                raise DownloadFailed(f"{red}: {exc.strerror or exc}") from None
        if len(data) > max_bytes:
            raise DownloadFailed(f"{red}: larger than {max_bytes} bytes")
        return Body(data, (url,))

    http = _http or Http(settings)
    errors = read_errors()

    def attempt() -> Body:
        resp = http.get(url, {})
        with resp:
            hops = (*(r.url for r in resp.history), resp.url)
            if https_only:
                plain = [h for h in hops if scheme_of(h) != "https"]
                if plain:
                    raise DownloadFailed(f"{red}: redirected to {redact_url(plain[0])}, not "
                                         "https: what decides what runs as root must come "
                                         "over TLS")
            raise_for_status(resp, url)
            length = resp.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                raise DownloadFailed(f"{red}: {length} bytes, more than {max_bytes}")
            chunks: list[bytes] = []
            got = 0
            try:
                while got <= max_bytes:
                    chunk = resp.raw.read(min(CHUNK_SIZE, max_bytes + 1 - got))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
            except errors as exc:
                raise Transient(
                    f"connection lost after {got} bytes: {reason_of(exc, url)}"
                ) from None
            if got > max_bytes:
                raise DownloadFailed(f"{red}: larger than {max_bytes} bytes")
            if length is not None and length.isdigit() and got < int(length):
                raise Transient(f"short body: {got} of {length} bytes")
            return Body(b"".join(chunks), hops)

    try:
        return with_retries(attempt, settings, red, next_source=_next_source)
    finally:
        if _http is None:
            http.close()


