"""HTTP over requests: one session per fetch, status mapping, transient failures."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Callable, cast

from installer import __version__
from installer.delivery.settings import DownloadSettings
from installer.delivery.urls import redact_url, scrub, split_credentials
from installer.errors import DownloadFailed, DownloadForbidden, DownloadNotFound

if TYPE_CHECKING:
    import requests


class Transient(Exception):
    """A failure worth another attempt after a backoff (5xx, 429, resets, timeouts)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class Unreachable(Transient):
    """No connection at all: the name does not resolve, the port refuses, the connect timed
    out. Worth trying the next mirror at once rather than this one again."""


@functools.cache
def session_class() -> type[requests.Session]:
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
def no_auth() -> Any:
    import requests

    class _NoAuth(requests.auth.AuthBase):
        """Passing an auth object stops requests from reading credentials out of ~/.netrc."""

        def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
            return r

    return _NoAuth()


class Http:
    """One requests session for a fetch; proxies and CA bundles come from the environment."""

    def __init__(self, settings: DownloadSettings) -> None:
        self.settings = settings
        self._session: requests.Session | None = None

    def session(self) -> requests.Session:
        if self._session is None:
            import requests

            session = session_class()()
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
        """GET with streaming; maps transport failures to Transient or DownloadFailed."""
        import requests

        bare, creds = split_credentials(url)
        auth: Any = requests.auth.HTTPBasicAuth(*creds) if creds else no_auth()
        timeout = (self.settings.connect_timeout, self.settings.read_timeout)
        try:
            return self.session().get(
                bare, headers=headers, stream=True, timeout=timeout, auth=auth
            )
        except requests.exceptions.SSLError as exc:
            raise DownloadFailed(
                f"{redact_url(url)}: TLS failure: {reason_of(exc, url)}",
                hint=(
                    "The server's certificate was not trusted. Behind a TLS-inspecting proxy set "
                    "REQUESTS_CA_BUNDLE to its CA bundle, or use a mirror."
                ),
            ) from None
        except requests.exceptions.ConnectTimeout:
            raise Unreachable(
                f"connection timed out after {self.settings.connect_timeout:g} s"
            ) from None
        except requests.exceptions.ReadTimeout:
            raise Transient(f"no response within {self.settings.read_timeout:g} s") from None
        except (
            requests.exceptions.InvalidURL,
            requests.exceptions.InvalidSchema,
            requests.exceptions.MissingSchema,
            requests.exceptions.InvalidHeader,
            requests.exceptions.TooManyRedirects,
        ) as exc:
            raise DownloadFailed(f"{redact_url(url)}: {reason_of(exc, url)}") from None
        except requests.exceptions.ConnectionError as exc:
            if _never_connected(exc):
                raise Unreachable(f"connection failed: {reason_of(exc, url)}") from None
            raise Transient(f"connection failed: {reason_of(exc, url)}") from None
        except requests.exceptions.RequestException as exc:
            raise Transient(f"connection failed: {reason_of(exc, url)}") from None


def _never_connected(exc: BaseException) -> bool:
    """Whether the failure happened before a connection existed (DNS, refused, unroutable)."""
    import urllib3

    inner: object = exc
    for _ in range(5):
        if isinstance(inner, urllib3.exceptions.NewConnectionError):  # incl. NameResolutionError
            return True
        nxt = getattr(inner, "reason", None)
        if nxt is None:
            args = getattr(inner, "args", ())
            nxt = args[0] if args and isinstance(args[0], BaseException) else None
        if nxt is None:
            return False
        inner = nxt
    return False


def reason_of(exc: BaseException, url: str) -> str:
    """The innermost useful reason of a requests/urllib3 exception, without credentials."""
    return scrub(innermost_reason(exc), url)


def innermost_reason(exc: BaseException) -> str:
    """The innermost useful reason of a requests/urllib3 exception, as the library wrote it."""
    inner: BaseException = exc
    for _ in range(5):
        nxt = getattr(inner, "reason", None)
        if not isinstance(nxt, BaseException):
            args = getattr(inner, "args", ())
            nxt = args[0] if args and isinstance(args[0], BaseException) else None
        if nxt is None:
            break
        inner = nxt
    return str(inner) or type(inner).__name__


def parse_retry_after(value: str | None) -> float | None:
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


def forbidden_hint(has_credentials: bool) -> str:
    if has_credentials:
        fact = "The credentials in the URL were sent as HTTP basic auth and refused; check them."
    else:
        fact = (
            "No credentials were sent: the installer adds an Authorization header only when "
            "the URL carries user:password@. The server refuses anonymous access."
        )
    return f"{fact} Check the bucket's policy, or add a mirror or a file:// source."


def raise_for_status(resp: requests.Response, url: str) -> None:
    """Returns for 2xx; raises the mapped error otherwise."""
    status = resp.status_code
    if 200 <= status < 300:
        return
    what = f"{redact_url(url)}: HTTP {status} {resp.reason or ''}".rstrip()
    if status in (404, 410):
        raise DownloadNotFound(what)
    if status in (401, 403):
        creds = split_credentials(url)[1] is not None
        raise DownloadForbidden(what, hint=forbidden_hint(creds))
    if status in (408, 429) or status >= 500:
        raise Transient(
            f"HTTP {status} {resp.reason or ''}".rstrip(),
            retry_after=parse_retry_after(resp.headers.get("Retry-After")),
        )
    raise DownloadFailed(what)


def body_readinto(resp: requests.Response) -> Callable[[memoryview], int]:
    """The cheapest way to pull the body into our buffer, one socket read per call.

    For a plain (not chunked) body this reads straight from the socket into our buffer (no
    urllib3 copies), after taking what http.client's buffered reader read ahead with the
    headers. The reader itself is not used past that: its `readinto1` copies its buffered
    bytes and then reads the socket in the same call, and when that read fails the call
    raises and the copied bytes are lost, so a part would end short of what was received.
    We asked for identity encoding, so no decoding is skipped.
    """
    raw = resp.raw
    fp = getattr(raw, "_fp", None)
    sock_file = getattr(fp, "fp", None)
    sock_io = getattr(sock_file, "raw", None)
    if (
        fp is not None
        and getattr(fp, "chunked", True) is False
        and callable(getattr(sock_file, "peek", None))
        and callable(getattr(sock_io, "readinto", None))
    ):
        length = getattr(fp, "length", None)
        left = [length if isinstance(length, int) else -1]
        buffered = cast("Any", sock_file)
        socket_readinto = cast("Any", sock_io).readinto
        read_ahead = [True]

        def readinto(view: memoryview) -> int:
            if left[0] == 0:
                return 0
            if 0 < left[0] < len(view):
                view = view[: left[0]]
            if read_ahead[0]:
                # peek returns the read-ahead, or reads the socket once when there is none;
                # readinto1 of exactly that many bytes copies them without touching the socket.
                pending = len(buffered.peek(0))
                if pending <= len(view):
                    read_ahead[0] = False
                n = int(buffered.readinto1(view[: min(pending, len(view))])) if pending else 0
            else:
                n = int(socket_readinto(view) or 0)
            if left[0] > 0:
                left[0] -= n
            return n

        return readinto
    if fp is not None and callable(getattr(fp, "readinto", None)):
        return cast("Callable[[memoryview], int]", fp.readinto)
    return cast("Callable[[memoryview], int]", raw.readinto)


def read_errors() -> tuple[type[BaseException], ...]:
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


