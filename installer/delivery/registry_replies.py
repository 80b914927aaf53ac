"""Reading an OCI registry's replies: bodies in bounded chunks, taken as stored, and every
failure (a status, a reset, a stall, a body cut short, a deadline) worded as
RegistryUnavailable (or a subclass) naming the reason and the redacted URL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from installer.delivery.deadline import Deadline
from installer.delivery.transport import read_errors
from installer.delivery.urls import redact_url
from installer.errors import ArtifactInvalid, RegistryAuthFailed, RegistryUnavailable

if TYPE_CHECKING:
    import requests

CHUNK = 1 << 20


def why(exc: BaseException) -> str:
    """The innermost reason of a requests/urllib3/socket failure, as its library wrote it."""
    inner = exc
    for _ in range(6):
        nxt = getattr(inner, "reason", None)
        if not isinstance(nxt, BaseException):
            args = getattr(inner, "args", ())
            if args and isinstance(args[0], str) and args[0]:
                return args[0]
            nxt = args[0] if args and isinstance(args[0], BaseException) else None
        if nxt is None:
            break
        inner = nxt
    return str(inner) or type(inner).__name__


def failure(what: str, exc: BaseException | None, deadline: Deadline | None) -> RegistryUnavailable:
    if deadline is not None and deadline.expired:
        return RegistryUnavailable(f"{what}: not done within the {deadline.seconds:.0f} s allowed "
                                   "(the registry answers too slowly)")
    return RegistryUnavailable(f"{what}: {why(exc) if exc is not None else 'failed'}")


def iter_body(resp: requests.Response, size: int, what: str,
              deadline: Deadline | None = None) -> Iterator[bytes]:
    """The body in chunks of up to `size` bytes, every failure to read it (a reset, a stall, a
    body cut short, a deadline) RegistryUnavailable naming the URL. Bodies are taken as
    stored: a transfer compression the installer did not ask for is refused, never decoded."""
    where = f"{what} (GET {redact_url(resp.url or '')})"
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise RegistryUnavailable(f"{where}: sent with Content-Encoding {encoding}, not the "
                                  "identity encoding asked for")
    errors = read_errors()
    chunks = resp.iter_content(size)
    while True:
        try:
            chunk = next(chunks)
        except StopIteration:
            break
        except errors as exc:
            raise failure(where, exc, deadline) from None
        if deadline is not None and deadline.expired:
            raise failure(where, None, deadline)
        yield chunk
    if deadline is not None and deadline.expired:  # a cut connection can look like an end
        raise failure(where, None, deadline)


def read_bounded(resp: requests.Response, limit: int, what: str,
                 deadline: Deadline | None = None) -> bytes:
    """The body, read in chunks and abandoned past `limit` bytes (never held whole)."""
    length = resp.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > limit:
        raise ArtifactInvalid(f"{what}: {length} bytes, more than the {limit} allowed")
    chunks: list[bytes] = []
    got = 0
    for chunk in iter_body(resp, min(CHUNK, limit + 1), what, deadline):
        chunks.append(chunk)
        got += len(chunk)
        if got > limit:
            raise ArtifactInvalid(f"{what}: more than the {limit} bytes allowed")
    return b"".join(chunks)


def check(resp: Any, what: str) -> None:
    if resp.status_code in (401, 403):
        raise RegistryAuthFailed(f"{what}: HTTP {resp.status_code} {resp.reason or ''}".rstrip())
    if not 200 <= resp.status_code < 300:
        raise RegistryUnavailable(f"{what}: HTTP {resp.status_code} {resp.reason or ''}".rstrip())
