"""Downloads: mirrors, retries with backoff, resume, SHA-256 while writing, a verified cache.

The only module that imports requests and tenacity; both are imported inside functions so that
`installer --help` and the warm path never pay for them.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
import queue
import random
import re
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, NoReturn, Optional, TypeVar, cast
from urllib.parse import unquote, urlsplit, urlunsplit

from installer import __version__
from installer.errors import (
    ChecksumMismatch,
    ConfigError,
    DownloadFailed,
    DownloadForbidden,
    DownloadNotFound,
    HostLayoutError,
    InsufficientSpace,
)
from installer.hostroot import write_atomic
from installer.progress import Progress, ProgressMode, resolve_mode

if TYPE_CHECKING:
    import requests
    import tenacity

log = logging.getLogger("installer.download")

VerifiedBy = Literal["pin", "published-sha256sum", "none"]
T = TypeVar("T")

SUPPORTED_SCHEMES = ("http", "https", "file")
# Large chunks keep the per-chunk Python overhead (hash update, write, progress check) small
# next to the kernel's copies; four 1 MiB buffers in flight keep memory flat.
CHUNK_SIZE = 1 << 20
PART_SUFFIX = ".part"
RECORD_SUFFIX = ".download.json"
CHECKSUM_SUFFIX = ".sha256sum"
DEFAULT_MAX_BYTES = 16 << 20

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)
# Query parameters that carry secrets in signed URLs (S3 X-Amz-Signature/Credential, GCS
# X-Goog-Signature, Azure SAS `sig`, plain `token=`/`key=`).
_SECRET_QUERY_KEY_RE = re.compile(
    r"sig|signature|token|key|secret|password|passwd|credential|auth", re.IGNORECASE
)


@dataclass(frozen=True)
class DownloadSettings:
    """How hard to try.

    `retries` counts attempts after the first, per source (mirror). `read_timeout` is the
    longest silence tolerated while waiting for headers or body bytes, not a limit on the whole
    transfer. Backoff before retry n is drawn from [b/2, b], b = min(backoff_max,
    backoff_initial * 2**(n-1)), unless the server's Retry-After (at most retry_after_max) says
    otherwise. `progress`: "auto" (bar on a terminal, else log lines), "log", "bar", "none".
    """

    retries: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    # A 429/503 Retry-After up to this many seconds is obeyed; a longer one falls back to backoff.
    retry_after_max: float = 120.0
    progress: ProgressMode = "auto"

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError("retries must be >= 0")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise ValueError("timeouts must be > 0")
        if self.backoff_initial < 0 or self.backoff_max < 0 or self.retry_after_max < 0:
            raise ValueError("backoff values must be >= 0")
        resolve_mode(self.progress)


@dataclass(frozen=True)
class Fetched:
    """A verified (or knowingly unverified) file in the download dir."""

    path: Path
    sha256: str
    source: str  # redacted: safe to log and to store in state records
    bytes_transferred: int
    from_cache: bool
    verified_by: VerifiedBy


@dataclass(frozen=True)
class _Expected:
    sha256: str
    verified_by: VerifiedBy
    origin: str


class _Transient(Exception):
    """A failure worth another attempt after a backoff (5xx, 429, resets, timeouts)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


# --------------------------------------------------------------------------- URLs, credentials


def redact_url(url: str) -> str:
    """`url` safe to log: `user:pass@` becomes `***@` and secret-looking query values `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = parts.query
    if query:
        items = []
        for item in query.split("&"):
            name, sep, value = item.partition("=")
            if sep and value and _SECRET_QUERY_KEY_RE.search(unquote(name)):
                value = "***"
            items.append(f"{name}{sep}{value}")
        query = "&".join(items)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _secrets_of(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found: list[str] = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        found.append(userinfo)
        for piece in userinfo.split(":"):
            found.extend([piece, unquote(piece)])
    for item in parts.query.split("&"):
        name, sep, value = item.partition("=")
        if sep and value and _SECRET_QUERY_KEY_RE.search(unquote(name)):
            found.extend([value, unquote(value)])
    return sorted({s for s in found if s}, key=len, reverse=True)


def _scrub(text: str, url: str) -> str:
    """Remove `url`'s credentials from a message written by a library."""
    text = text.replace(url, redact_url(url))
    for secret in _secrets_of(url):
        text = text.replace(secret, "***")
    return text


def _split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """The URL without userinfo, and the (user, password) it carried, if any."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    bare = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return bare, (unquote(user), unquote(password))


def _local_path(url: str) -> Path:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise DownloadFailed(
            f"{redact_url(url)}: file:// URLs must name a local path (file:///path)",
            hint="Write file:///path/to/file (three slashes) for a file on this node.",
        )
    return Path(unquote(parts.path))


def _scheme(url: str) -> str:
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SUPPORTED_SCHEMES:
        raise DownloadFailed(
            f"{redact_url(url)}: unsupported URL scheme {scheme or '(none)'!r}",
            hint="Use an http://, https:// or file:// URL.",
        )
    return scheme


# --------------------------------------------------------------------------- checksums


def parse_sha256sum(text: str, name: str) -> str | None:
    """The digest for `name` in `sha256sum` output (`<hex>  <name>`), or the only digest there."""
    digests: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(None, 1)
        digest = fields[0].lower()
        if not _SHA256_RE.match(digest):
            continue
        listed = fields[1].strip().lstrip("*") if len(fields) > 1 else ""
        if listed and (listed == name or listed.rsplit("/", 1)[-1] == name):
            return digest
        digests.append(digest)
    return digests[0] if len(digests) == 1 else None


def _normalize_pin(sha256: str) -> str:
    pin = sha256.strip().lower()
    if pin.startswith("sha256:"):
        pin = pin[len("sha256:") :]
    if not _SHA256_RE.match(pin):
        raise ConfigError(f"the pinned SHA-256 {sha256!r} is not 64 hexadecimal digits")
    return pin


def _remote_name(url: str) -> str:
    return unquote(urlsplit(url).path.rsplit("/", 1)[-1])


# --------------------------------------------------------------------------- HTTP plumbing


@functools.cache
def _session_class() -> type[requests.Session]:
    import requests

    class _Session(requests.Session):
        # requests re-reads ~/.netrc on every redirect and would attach an Authorization
        # header the operator never asked for (cos-gpu-installer #80): drop that step.
        def rebuild_auth(
            self, prepared_request: requests.PreparedRequest, response: requests.Response
        ) -> None:
            headers = prepared_request.headers
            original = response.request.url
            should_strip = cast("Callable[[str, str], bool]", self.should_strip_auth)
            if (
                "Authorization" in headers
                and original is not None
                and prepared_request.url is not None
                and should_strip(original, prepared_request.url)
            ):
                del headers["Authorization"]

    return _Session


@functools.cache
def _no_auth() -> Any:
    import requests

    class _NoAuth(requests.auth.AuthBase):
        """Passing an auth object stops requests from reading credentials out of ~/.netrc."""

        def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
            return r

    return _NoAuth()


class _Http:
    """One requests session for a fetch; proxies and CA bundles come from the environment."""

    def __init__(self, settings: DownloadSettings) -> None:
        self.settings = settings
        self._session: requests.Session | None = None

    def session(self) -> requests.Session:
        if self._session is None:
            import requests

            session = _session_class()()
            # trust_env stays on: HTTP_PROXY/HTTPS_PROXY/NO_PROXY and REQUESTS_CA_BUNDLE apply.
            session.trust_env = True
            session.headers["User-Agent"] = (
                f"nvidia-driver-installer/{__version__} python-requests/{requests.__version__}"
            )
            # We hash the bytes as stored on the server; a transfer encoding would change them.
            session.headers["Accept-Encoding"] = "identity"
            self._session = session
        return self._session

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def get(self, url: str, headers: dict[str, str]) -> requests.Response:
        """GET with streaming; maps transport failures to _Transient or DownloadFailed."""
        import requests

        bare, creds = _split_credentials(url)
        auth: Any = requests.auth.HTTPBasicAuth(*creds) if creds else _no_auth()
        timeout = (self.settings.connect_timeout, self.settings.read_timeout)
        try:
            return self.session().get(
                bare, headers=headers, stream=True, timeout=timeout, auth=auth
            )
        except requests.exceptions.SSLError as exc:
            raise DownloadFailed(
                f"{redact_url(url)}: TLS failure: {_reason(exc, url)}",
                hint=(
                    "The server's certificate was not trusted. Behind a TLS-inspecting proxy set "
                    "REQUESTS_CA_BUNDLE to its CA bundle, or use a mirror."
                ),
            ) from None
        except requests.exceptions.ConnectTimeout:
            raise _Transient(
                f"connection timed out after {self.settings.connect_timeout:g} s"
            ) from None
        except requests.exceptions.ReadTimeout:
            raise _Transient(f"no response within {self.settings.read_timeout:g} s") from None
        except (
            requests.exceptions.InvalidURL,
            requests.exceptions.InvalidSchema,
            requests.exceptions.MissingSchema,
            requests.exceptions.InvalidHeader,
            requests.exceptions.TooManyRedirects,
        ) as exc:
            raise DownloadFailed(f"{redact_url(url)}: {_reason(exc, url)}") from None
        except requests.exceptions.RequestException as exc:
            raise _Transient(f"connection failed: {_reason(exc, url)}") from None


def _reason(exc: BaseException, url: str) -> str:
    """The innermost useful reason of a requests/urllib3 exception, without credentials."""
    inner: BaseException = exc
    for _ in range(5):
        nxt = getattr(inner, "reason", None)
        if not isinstance(nxt, BaseException):
            args = getattr(inner, "args", ())
            nxt = args[0] if args and isinstance(args[0], BaseException) else None
        if nxt is None:
            break
        inner = nxt
    text = str(inner) or type(inner).__name__
    return _scrub(text, url)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _forbidden_hint(has_credentials: bool) -> str:
    if has_credentials:
        fact = "The credentials in the URL were sent as HTTP basic auth and refused; check them."
    else:
        fact = (
            "No credentials were sent: the installer adds an Authorization header only when "
            "the URL carries user:password@. The server refuses anonymous access."
        )
    return f"{fact} Check the bucket's policy, or add a mirror or a file:// source."


def _raise_for_status(resp: requests.Response, url: str) -> None:
    """Returns for 2xx; raises the mapped error otherwise."""
    status = resp.status_code
    if 200 <= status < 300:
        return
    what = f"{redact_url(url)}: HTTP {status} {resp.reason or ''}".rstrip()
    if status in (404, 410):
        raise DownloadNotFound(what)
    if status in (401, 403):
        creds = _split_credentials(url)[1] is not None
        raise DownloadForbidden(what, hint=_forbidden_hint(creds))
    if status in (408, 429) or status >= 500:
        raise _Transient(
            f"HTTP {status} {resp.reason or ''}".rstrip(),
            retry_after=_retry_after(resp.headers.get("Retry-After")),
        )
    raise DownloadFailed(what)


def _body_readinto(resp: requests.Response) -> Callable[[memoryview], int]:
    """The cheapest way to pull the body into our buffer.

    http.client's readinto copies straight from the socket into the buffer; urllib3's own read
    path adds two copies per chunk. We asked for identity encoding, so no decoding is skipped.
    """
    raw = resp.raw
    fp = getattr(raw, "_fp", None)
    if fp is not None and callable(getattr(fp, "readinto", None)):
        return cast("Callable[[memoryview], int]", fp.readinto)
    return cast("Callable[[memoryview], int]", raw.readinto)


def _read_errors() -> tuple[type[BaseException], ...]:
    import http.client

    import requests
    import urllib3

    return (
        OSError,
        ValueError,
        http.client.HTTPException,
        urllib3.exceptions.HTTPError,
        requests.exceptions.RequestException,
    )


def _retrying(fn: Callable[[], T], settings: DownloadSettings, what: str) -> T:
    """Calls `fn` until it stops raising _Transient, with jittered exponential backoff."""
    import tenacity

    attempts = settings.retries + 1

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if (
            isinstance(exc, _Transient)
            and exc.retry_after is not None
            and exc.retry_after <= settings.retry_after_max
        ):
            return exc.retry_after
        base = min(
            settings.backoff_max, settings.backoff_initial * 2.0 ** (state.attempt_number - 1)
        )
        # Half fixed, half random: nodes that failed together do not retry together.
        return base / 2 + random.uniform(0, base / 2)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%s: attempt %d of %d failed: %s; retrying in %.1f s",
            what,
            state.attempt_number,
            attempts,
            exc,
            delay,
        )

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=wait,
        retry=tenacity.retry_if_exception_type(_Transient),
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        return retrying(fn)
    except _Transient as exc:
        raise DownloadFailed(f"{what}: {exc} (gave up after {attempts} attempts)") from None


# --------------------------------------------------------------------------- small files


def fetch_bytes(
    url: str,
    settings: DownloadSettings | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    _http: _Http | None = None,
) -> bytes:
    """The content of a small file (catalog, checksum file) over http(s) or file://.

    Touches nothing on the host. Raises DownloadNotFound (404/410 or missing file),
    DownloadForbidden (401/403 or unreadable file), DownloadFailed (other failures, retries
    exhausted, or more than `max_bytes`).
    """
    settings = settings or DownloadSettings()
    red = redact_url(url)
    if _scheme(url) == "file":
        path = _local_path(url)
        try:
            with path.open("rb") as handle:
                data = handle.read(max_bytes + 1)
        except FileNotFoundError:
            raise DownloadNotFound(f"{red}: no such file") from None
        except PermissionError:
            raise DownloadForbidden(f"{red}: permission denied") from None
        except OSError as exc:
            raise DownloadFailed(f"{red}: {exc.strerror or exc}") from None
        if len(data) > max_bytes:
            raise DownloadFailed(f"{red}: larger than {max_bytes} bytes")
        return data

    http = _http or _Http(settings)
    errors = _read_errors()

    def attempt() -> bytes:
        resp = http.get(url, {})
        with resp:
            _raise_for_status(resp, url)
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
                raise _Transient(
                    f"connection lost after {got} bytes: {_reason(exc, url)}"
                ) from None
            if got > max_bytes:
                raise DownloadFailed(f"{red}: larger than {max_bytes} bytes")
            if length is not None and length.isdigit() and got < int(length):
                raise _Transient(f"short body: {got} of {length} bytes")
            return b"".join(chunks)

    try:
        return _retrying(attempt, settings, red)
    finally:
        if _http is None:
            http.close()


# --------------------------------------------------------------------------- the part file


class _Part:
    """`<name>.part`: what is on disk and the running hash of exactly those bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.hasher = hashlib.sha256()
        self.size = 0
        self.known = False
        self.sources: set[str] = set()
        self.received = 0  # bytes moved over the network/copied by this call

    def sync(self) -> None:
        """Bring the hash up to date with the file (hashes a part left by an earlier run once)."""
        try:
            on_disk = self.path.stat().st_size
        except FileNotFoundError:
            on_disk = -1
        if self.known and on_disk == self.size:
            return
        self.hasher = hashlib.sha256()
        self.size = 0
        self.known = True
        if on_disk <= 0:
            return
        buf = bytearray(CHUNK_SIZE)
        view = memoryview(buf)
        try:
            with self.path.open("rb") as handle:
                while True:
                    n = handle.readinto(buf)
                    if not n:
                        break
                    self.hasher.update(view[:n])
                    self.size += n
        except OSError as exc:
            log.warning("cannot read %s (%s); starting over", self.path, exc)
            self.reset()
            return
        if self.size:
            log.info("resuming %s from %.1f MB", self.path.name, self.size / 1e6)
            self.sources.add("an earlier run")

    def reset(self) -> None:
        try:
            with self.path.open("wb"):
                pass
        except OSError as exc:
            _raise_write_error(exc, self.path)
        self.hasher = hashlib.sha256()
        self.size = 0
        self.known = True
        self.sources.clear()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.hasher = hashlib.sha256()
        self.size = 0
        self.known = True
        self.sources.clear()


def _raise_write_error(exc: OSError, path: Path) -> NoReturn:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise InsufficientSpace(f"no space left writing {path}") from None
    raise HostLayoutError(f"cannot write {path}: {exc.strerror or exc}") from None


def _check_space(directory: Path, needed: int, name: str) -> None:
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise InsufficientSpace(
            f"{name} needs {needed / 1e6:.1f} MB in {directory}, only {free / 1e6:.1f} MB free"
        )


class _BackgroundHash:
    """Feeds chunks to a hash on a helper thread while the caller receives and writes the next.

    hashlib releases the GIL for large updates, so SHA-256 overlaps the socket and disk work
    instead of adding to it; a few fixed buffers circulate, so memory stays flat.
    """

    def __init__(self, hasher: Any, depth: int = 4) -> None:
        self._hasher = hasher
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        self._todo: queue.SimpleQueue[Optional[tuple[bytearray, int]]] = queue.SimpleQueue()
        for _ in range(depth):
            self._free.put(bytearray(CHUNK_SIZE))
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        self._thread.start()

    def buffer(self) -> bytearray:
        return self._free.get()

    def give_back(self, buf: bytearray) -> None:
        self._free.put(buf)

    def submit(self, buf: bytearray, n: int) -> None:
        self._todo.put((buf, n))

    def _run(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            buf, n = item
            try:
                if self._error is None:
                    self._hasher.update(memoryview(buf)[:n])
            except BaseException as exc:  # surfaced by close() on the caller's thread
                self._error = exc
            finally:
                self._free.put(buf)

    def close(self) -> None:
        """Waits until every submitted chunk is hashed."""
        self._todo.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


def _pump(
    readinto: Callable[[memoryview], int],
    part: _Part,
    progress: Progress,
    read_errors: tuple[type[BaseException], ...],
    describe: Callable[[BaseException], str],
) -> int:
    """Append everything `readinto` yields to the part, hashing as it goes; fsync at the end.

    On any exit the hash covers exactly the bytes written to the part, so a retry can resume.
    """
    got = 0
    try:
        out = part.path.open("ab")
    except OSError as exc:
        _raise_write_error(exc, part.path)
    hashing = _BackgroundHash(part.hasher)
    try:
        with out:
            while True:
                buf = hashing.buffer()
                try:
                    n = readinto(memoryview(buf))
                except read_errors as exc:
                    hashing.give_back(buf)
                    raise _Transient(
                        f"connection lost after {got} bytes of the body: {describe(exc)}"
                    ) from None
                if not n:
                    hashing.give_back(buf)
                    break
                try:
                    out.write(memoryview(buf)[:n])
                except OSError as exc:
                    hashing.give_back(buf)
                    part.known = False
                    _raise_write_error(exc, part.path)
                hashing.submit(buf, n)
                part.size += n
                part.received += n
                got += n
                progress.update(n)
            try:
                out.flush()
                os.fsync(out.fileno())
            except OSError as exc:
                part.known = False
                _raise_write_error(exc, part.path)
    finally:
        hashing.close()
    return got


# --------------------------------------------------------------------------- one source


def _http_attempt(
    http: _Http, url: str, part: _Part, label: str, settings: DownloadSettings
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
            raise _Transient("HTTP 416 range not satisfiable; restarting from zero")
        _raise_for_status(resp, url)
        length_header = resp.headers.get("Content-Length")
        body_length = int(length_header) if length_header and length_header.isdigit() else None
        if status == 206:
            match = _CONTENT_RANGE_RE.match(resp.headers.get("Content-Range", ""))
            if match is None or int(match.group(1)) != part.size:
                part.reset()
                raise _Transient(
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
        if total is not None:
            _check_space(part.path.parent, total - part.size, label)
        part.sources.add(url)
        progress = Progress(label, total, mode=settings.progress, start=part.size, logger=log)
        errors = _read_errors()
        got = _pump(_body_readinto(resp), part, progress, errors, lambda e: _reason(e, url))
        if body_length is not None and got < body_length:
            raise _Transient(f"short body: {got} of {body_length} bytes")
        if total is not None and part.size != total:
            raise _Transient(f"file ended at {part.size} of {total} bytes")
        progress.finish()


def _copy_local(url: str, part: _Part, label: str, settings: DownloadSettings) -> None:
    red = redact_url(url)
    path = _local_path(url)
    part.reset()
    try:
        src = path.open("rb")
    except FileNotFoundError:
        raise DownloadNotFound(f"{red}: no such file") from None
    except PermissionError:
        raise DownloadForbidden(f"{red}: permission denied") from None
    except OSError as exc:
        raise DownloadFailed(f"{red}: {exc.strerror or exc}") from None
    with src:
        total = os.fstat(src.fileno()).st_size
        _check_space(part.path.parent, total, label)
        part.sources.add(url)
        progress = Progress(label, total, mode=settings.progress, logger=log)
        try:
            _pump(src.readinto, part, progress, (OSError,), str)
        except _Transient as exc:  # a local read error: retrying will not help
            raise DownloadFailed(f"{red}: {exc}") from None
    if part.size != total:
        raise DownloadFailed(f"{red}: changed while being copied ({part.size} of {total} bytes)")
    progress.finish()


def _published(
    checksum_urls: Sequence[str], name: str, settings: DownloadSettings, http: _Http
) -> _Expected | None:
    """The digest published beside the file, or None when none is (404, refused)."""
    for url in checksum_urls:
        red = redact_url(url)
        try:
            text = fetch_bytes(url, settings, max_bytes=1 << 20, _http=http)
        except (DownloadNotFound, DownloadForbidden) as exc:
            # S3 answers 403, not 404, for a missing key when listing is not allowed.
            log.info("no checksum file at %s (%s)", red, exc.message.rsplit(": ", 1)[-1])
            continue
        digest = parse_sha256sum(text.decode("utf-8", "replace"), name)
        if digest is None:
            raise DownloadFailed(f"{red}: no SHA-256 for {name} in the checksum file")
        return _Expected(digest, "published-sha256sum", f"published in {red}")
    return None


def _fetch_from(
    url: str,
    part: _Part,
    dest: Path,
    expected: _Expected | None,
    checksum_urls: Sequence[str] | None,
    settings: DownloadSettings,
    http: _Http,
) -> Fetched:
    scheme = _scheme(url)
    red = redact_url(url)
    label = dest.name
    if expected is None and checksum_urls is None:
        expected = _published([url + CHECKSUM_SUFFIX], _remote_name(url), settings, http)
    if expected is None:
        log.warning("no published SHA-256 for %s: %s will not be verified", red, dest.name)
    log.info("fetching %s from %s", dest.name, red)
    started = time.monotonic()
    received_before = part.received
    for fresh in (False, True):
        if scheme == "file":
            _copy_local(url, part, label, settings)
        else:
            _retrying(lambda: _http_attempt(http, url, part, label, settings), settings, red)
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
        os.replace(part.path, dest)
    except OSError as exc:
        _raise_write_error(exc, dest)
    verified_by: VerifiedBy = expected.verified_by if expected else "none"
    _write_record(dest, actual, red, verified_by)
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


# --------------------------------------------------------------------------- the cache record


def _record_path(dest: Path) -> Path:
    return dest.with_name(dest.name + RECORD_SUFFIX)


def _write_record(dest: Path, sha256: str, source: str, verified_by: VerifiedBy) -> None:
    record = {
        "filename": dest.name,
        "size": dest.stat().st_size,
        "sha256": sha256,
        "source": source,
        "verified_by": verified_by,
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        write_atomic(_record_path(dest), json.dumps(record, indent=1) + "\n")
        fd = os.open(dest.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        _raise_write_error(exc, _record_path(dest))


def _read_record(dest: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(_record_path(dest).read_text())
    except (OSError, ValueError):
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
    record = _read_record(dest)
    if record is None:
        return None
    try:
        size = dest.stat().st_size
    except OSError:
        return None
    if size != record["size"]:
        return None
    pin = _normalize_pin(sha256) if sha256 else None
    if pin is not None and pin != record["sha256"].lower():
        return None
    verified = record.get("verified_by")
    verified_by: VerifiedBy = (
        "pin" if pin else verified if verified in ("pin", "published-sha256sum") else "none"
    )
    return Fetched(dest, record["sha256"], str(record.get("source", "")), 0, True, verified_by)


def _reuse(dest: Path, pin: str | None) -> Fetched | None:
    cached = find_cached(dest.parent, dest.name, sha256=pin)
    if cached is not None:
        return cached
    if not dest.exists():
        return None
    if pin is not None and _read_record(dest) is None and dest.is_file():
        # A file placed by hand (or left by a crash before its record was written): hash it.
        digest = hashlib.sha256()
        try:
            with dest.open("rb") as handle:
                for block in iter(lambda: handle.read(CHUNK_SIZE), b""):
                    digest.update(block)
        except OSError as exc:
            raise HostLayoutError(f"cannot read {dest}: {exc.strerror or exc}") from None
        if digest.hexdigest() == pin:
            _write_record(dest, pin, "already present", "pin")
            return Fetched(dest, pin, "already present", 0, True, "pin")
    log.info(
        "%s in %s does not match its record or the pin; fetching it again", dest.name, dest.parent
    )
    # Drop only the record: the file stays until a verified download replaces it atomically,
    # so a failed download never costs an operator a file they placed there.
    try:
        _record_path(dest).unlink(missing_ok=True)
    except OSError as exc:
        raise HostLayoutError(f"cannot replace {dest}: {exc.strerror or exc}") from None
    return None


# --------------------------------------------------------------------------- the entry point


def fetch_file(
    urls: Sequence[str],
    dest_dir: Path,
    filename: str,
    *,
    sha256: str | None = None,
    checksum_urls: Sequence[str] | None = None,
    settings: DownloadSettings | None = None,
) -> Fetched:
    """Make `dest_dir/filename` hold the file served at the first working URL of `urls`.

    Reuses a file recorded by an earlier call (no network) when its size and the pin match.
    Otherwise streams to `<filename>.part` (resuming one left behind), verifies it against the
    pin, or the published `<url>.sha256sum` (or `checksum_urls`), renames it into place and
    writes `<filename>.download.json`. Writes only under `dest_dir`.

    Raises ChecksumMismatch (the file is deleted; other mirrors are not tried), InsufficientSpace,
    DownloadNotFound / DownloadForbidden (every source answered so), DownloadFailed (otherwise,
    listing each source's last error), HostLayoutError (dest_dir not writable), ConfigError (a
    malformed pin).
    """
    settings = settings or DownloadSettings()
    sources = list(urls)
    if not sources:
        raise ValueError("fetch_file needs at least one URL")
    if not filename or "/" in filename or filename in (".", ".."):
        raise ValueError(f"not a plain file name: {filename!r}")
    pin = _normalize_pin(sha256) if sha256 else None
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HostLayoutError(f"cannot create {dest_dir}: {exc.strerror or exc}") from None
    dest = dest_dir / filename
    cached = _reuse(dest, pin)
    if cached is not None:
        log.info(
            "using %s from the cache (sha256 %s, verified by %s)",
            dest,
            cached.sha256,
            cached.verified_by,
        )
        return cached

    http = _Http(settings)
    part = _Part(dest_dir / (filename + PART_SUFFIX))
    try:
        expected: Optional[_Expected] = (
            _Expected(pin, "pin", "the pinned value") if pin is not None else None
        )
        if expected is None and checksum_urls is not None:
            expected = _published(list(checksum_urls), filename, settings, http)
        failures: list[DownloadFailed] = []
        for url in sources:
            try:
                return _fetch_from(url, part, dest, expected, checksum_urls, settings, http)
            except DownloadFailed as exc:
                failures.append(exc)
                if len(sources) > 1:
                    log.warning("source failed: %s", exc.message)
        raise _all_failed(failures)
    finally:
        http.close()


def _all_failed(failures: list[DownloadFailed]) -> DownloadFailed:
    if len(failures) == 1:
        return failures[0]
    lines = "\n".join(f"  - {exc.message}" for exc in failures)
    message = f"all {len(failures)} sources failed:\n{lines}"
    kinds = {type(exc) for exc in failures}
    if len(kinds) == 1 and kinds.pop() in (DownloadNotFound, DownloadForbidden):
        return type(failures[0])(message, hint=failures[0].hint)
    return DownloadFailed(message)
