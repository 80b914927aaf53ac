"""A small OCI distribution client (the registry HTTP API) on requests: manifests and blobs
read with size limits, uploads, and authentication the installer keeps in its own hands.

Authentication follows the distribution spec and Docker's token spec: a 401 names the scheme.
Basic: the credentials go to the registry itself, and only there. Bearer: a token is fetched
from the challenge's realm, which must be the registry's own scheme and host, or an https
service the operator listed (NVIDIA_MODULE_REGISTRY_TOKEN_REALMS); any other realm is refused
before a byte is sent to it. Credentials are never read from ~/.docker/config.json, a
credential helper or ORAS_* variables: only from the settings.

Every failure, in the request or while its body is read, is RegistryUnavailable (or a subclass)
naming the reason and the redacted URL (installer.delivery.registry_replies). A client has an
overall deadline (`budget`): past it its connections are shut down (installer.delivery.deadline).
Only bodies the installer needs are read, each within a size limit; redirects are followed here
so that no redirect body is read.

Why not oras-py, which an earlier version used: its token flow sends Basic credentials to
whatever realm a registry names, it reads manifests whole, and its retry decorator sleeps for
minutes on a dead registry.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from installer.delivery.deadline import Deadline, watching_adapter
from installer.delivery.registry_replies import CHUNK, check, failure, iter_body, read_bounded
from installer.delivery.transport import no_auth, read_errors, session_class
from installer.delivery.urls import redact_url
from installer.errors import (
    ArtifactInvalid,
    RegistryAuthFailed,
    RegistryRealmRefused,
    RegistryUnavailable,
)

if TYPE_CHECKING:
    import requests

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
TOKEN_LIMIT = 64 << 10
# One lookup or one pull must end within PULL_DEADLINE seconds, plus a second per SLOWEST_RATE
# bytes it carries (NVIDIA's modules, ~135 MB: 7 min 9 s): a registry that keeps sending a byte
# now and then never trips the read timeout, and would otherwise hold the node for days.
PULL_DEADLINE = 300.0
SLOWEST_RATE = 1 << 20
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
_SMALL = 64 << 10  # a reply read to its end (and its connection kept) though nobody needs it
_PARAM = re.compile(r'([A-Za-z]+)="([^"]*)"')


@dataclass(frozen=True)
class RegistrySettings:
    """Where artifacts live: `host[:port]/repository`, and how to reach it."""

    repository: str
    plain_http: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    token_realms: tuple[str, ...] = ()  # https://host[:port] token services allowed besides it
    deadline: float = PULL_DEADLINE  # seconds for one lookup, or a pull before its size is added

    @property
    def host(self) -> str:
        return self.repository.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.repository.split("/", 1)[1]

    @property
    def base(self) -> str:
        return f"{'http' if self.plain_http else 'https'}://{self.host}"

    def reference(self, tag_or_digest: str) -> str:
        sep = "@" if tag_or_digest.startswith("sha256:") else ":"
        return f"{self.repository}{sep}{tag_or_digest}"


@dataclass(frozen=True)
class Challenge:
    scheme: str
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge:
    scheme, _, rest = header.strip().partition(" ")
    return Challenge(scheme.lower(), {k.lower(): v for k, v in _PARAM.findall(rest)})


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def budget(settings: RegistrySettings, size: int) -> float:
    """The seconds a client may take to move `size` bytes (besides its small reads)."""
    return settings.deadline + size / SLOWEST_RATE


@functools.cache
def _session_class() -> type[requests.Session]:
    class _Session(session_class()):  # type: ignore[misc, valid-type]
        # requests reads a redirect's whole body (to reuse the connection) even when told not
        # to follow it; Client.request follows redirects itself and never reads their bodies.
        def get_redirect_target(self, resp: requests.Response) -> str | None:
            return None

    return _Session


class Client:
    """One registry, one repository, one session, one deadline (`budget` seconds, by default
    the settings' deadline): close() it."""

    def __init__(self, settings: RegistrySettings, budget: float | None = None) -> None:
        self.settings = settings
        self.deadline = Deadline(settings.deadline if budget is None else budget)
        self.session = _session_class()()
        for prefix in ("http://", "https://"):
            self.session.mount(prefix, watching_adapter(self.deadline))
        self.session.trust_env = True  # proxies and REQUESTS_CA_BUNDLE from the environment
        self.session.headers["Accept-Encoding"] = "identity"
        self.session.auth = no_auth()  # never credentials out of ~/.netrc
        self._basic: str | None = None
        if settings.username:
            raw = f"{settings.username}:{settings.password or ''}".encode()
            self._basic = base64.b64encode(raw).decode()
        self._scheme: str | None = None  # "basic" or "bearer", once the registry said so
        self._token: str | None = None

    def close(self) -> None:
        self.session.close()
        self.deadline.close()

    # ----------------------------------------------------------------- requests

    def url(self, path: str) -> str:
        return f"{self.settings.base}/v2/{self.settings.name}/{path}"

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                data: bytes | None = None, stream: bool = True) -> requests.Response:
        """One call, authenticated as the registry asks (at most one challenge answered),
        redirects of GET and HEAD followed. The body is left unread (`stream` is ignored: a
        body read whole would escape the size limits): read it with `read`/`stream_blob`, or
        `release` it."""
        timeout = (self.settings.connect_timeout, self.settings.read_timeout)
        errors = read_errors()
        challenged = False
        for _ in range(MAX_REDIRECTS + 2):
            what = f"{method} {redact_url(url)}"
            if self.deadline.expired:
                raise failure(what, None, self.deadline)
            sent = dict(headers or {})
            auth = self._authorization(url)
            if auth:
                sent["Authorization"] = auth
            try:
                resp = self.session.request(method, url, headers=sent, data=data, stream=True,
                                            timeout=timeout, allow_redirects=False)
            except errors as exc:
                raise failure(what, exc, self.deadline) from None
            if resp.status_code == 401 and not challenged:
                challenged = True
                challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
                self.release(resp)
                self._answer(challenge, url)
                continue
            location = resp.headers.get("Location")
            if resp.status_code in _REDIRECTS and location and method in ("GET", "HEAD"):
                self.release(resp)
                url = _joined(url, location, "redirects to")
                continue
            return resp
        raise RegistryUnavailable(f"{method} {redact_url(url)}: more than {MAX_REDIRECTS} "
                                  "redirects")

    def read(self, resp: requests.Response, limit: int, what: str) -> bytes:
        """The body of `resp`, at most `limit` bytes, within the deadline."""
        return read_bounded(resp, limit, what, self.deadline)

    def release(self, resp: requests.Response) -> None:
        """Close `resp`. A small body is read to its end first, so that the connection serves
        the next request (a TLS handshake saved); a large or endless one is never read."""
        length = resp.headers.get("Content-Length", "")
        method = getattr(resp.request, "method", None)
        if method == "HEAD" or (length.isdigit() and int(length) <= _SMALL):
            with contextlib.suppress(RegistryUnavailable):
                self.read(resp, _SMALL, "a reply")
        resp.close()

    def _authorization(self, url: str) -> str | None:
        parts = urlsplit(url)
        if f"{parts.scheme}://{parts.netloc}" != self.settings.base:
            # A redirect target (blob storage) gets no credentials, nor does the registry's
            # own host over another scheme (a TLS registry redirecting to http://).
            return None
        if self._scheme == "bearer" and self._token:
            return f"Bearer {self._token}"
        if self._scheme == "basic" and self._basic:
            return f"Basic {self._basic}"
        return None

    def _answer(self, challenge: Challenge, url: str) -> None:
        host = self.settings.host
        if challenge.scheme == "basic":
            if not self._basic:
                raise RegistryAuthFailed(f"{host} asks for credentials (Basic)")
            if self._scheme == "basic":
                raise RegistryAuthFailed(f"{host} refused the credentials (HTTP 401)")
            self._scheme = "basic"
            return
        if challenge.scheme != "bearer" or "realm" not in challenge.params:
            raise RegistryAuthFailed(f"{host} asks for an unknown authentication "
                                     f"({challenge.scheme or 'no challenge'})")
        self._scheme = "bearer"
        self._token = self._fetch_token(challenge.params)

    def _realm_allowed(self, realm: str) -> bool:
        parts = urlsplit(realm)
        origin = f"{parts.scheme}://{parts.netloc}"
        if origin == self.settings.base:
            return True  # the registry itself, over the scheme the operator set for it
        return parts.scheme == "https" and origin in self.settings.token_realms

    def _fetch_token(self, params: dict[str, str]) -> str:
        realm = _joined(self.settings.base + "/", params["realm"], "sends token requests to")
        if not self._realm_allowed(realm):
            raise RegistryRealmRefused(
                f"{self.settings.host} sends token requests to {realm}, which is neither the "
                "registry itself nor listed in NVIDIA_MODULE_REGISTRY_TOKEN_REALMS: refused, "
                "nothing was sent there")
        query = {k: params[k] for k in ("service", "scope") if k in params}
        headers = {"Authorization": f"Basic {self._basic}"} if self._basic else {}
        timeout = (self.settings.connect_timeout, self.settings.read_timeout)
        try:
            resp = self.session.get(realm, params=query, headers=headers, stream=True,
                                    timeout=timeout, allow_redirects=False)
        except read_errors() as exc:
            raise failure(f"token from {redact_url(realm)}", exc, self.deadline) from None
        with resp:
            if resp.status_code in (401, 403):
                raise RegistryAuthFailed(f"the token service {realm} refused "
                                         f"(HTTP {resp.status_code})")
            check(resp, f"token from {realm}")
            try:
                answer = json.loads(self.read(resp, TOKEN_LIMIT, f"token from {realm}"))
                token = answer.get("token") or answer.get("access_token")
            except (ValueError, AttributeError, ArtifactInvalid):
                token = None
        if not isinstance(token, str) or not token:
            raise RegistryAuthFailed(f"the token service {realm} sent no token")
        return token

    # ----------------------------------------------------------------- the API

    def probe(self) -> None:
        """GET /v2/: fails fast when the registry is down or refuses the credentials."""
        resp = self.request("GET", f"{self.settings.base}/v2/")
        with resp:
            check(resp, f"{self.settings.host}/v2/")
            self.release(resp)

    def get_manifest(self, reference: str, limit: int) -> bytes | None:
        """The manifest's bytes (at most `limit`), or None when there is none (404)."""
        ref = self.settings.reference(reference)
        resp = self.request("GET", self.url(f"manifests/{reference}"),
                            headers={"Accept": MANIFEST_MEDIA_TYPE}, stream=True)
        with resp:
            if resp.status_code == 404:
                self.release(resp)
                return None
            check(resp, f"manifest {ref}")
            body = self.read(resp, limit, f"manifest {ref}")
        claimed = resp.headers.get("Docker-Content-Digest")
        if reference.startswith("sha256:") and digest_of(body) != reference:
            raise ArtifactInvalid(f"manifest {ref} hashes to {digest_of(body)}")
        if claimed and claimed != digest_of(body):
            raise ArtifactInvalid(f"manifest {ref}: served as {claimed}, hashes to "
                                  f"{digest_of(body)}")
        return body

    def get_blob(self, digest: str, limit: int) -> bytes:
        """A small blob, whole, checked against its digest."""
        what = f"blob {digest} of {self.settings.repository}"
        resp = self.request("GET", self.url(f"blobs/{digest}"), stream=True)
        with resp:
            check(resp, what)
            body = self.read(resp, limit, what)
        if digest_of(body) != digest:
            raise ArtifactInvalid(f"{what} does not hash to its digest")
        return body

    def stream_blob(self, digest: str, limit: int | None = None) -> Iterator[bytes]:
        """A blob's chunks as they arrive (the caller hashes them, and bounds them when no
        `limit` is given: a larger Content-Length is refused before a byte is read)."""
        what = f"blob {digest} of {self.settings.repository}"
        resp = self.request("GET", self.url(f"blobs/{digest}"), stream=True)
        with resp:
            check(resp, what)
            length = resp.headers.get("Content-Length", "")
            if limit is not None and length.isdigit() and int(length) > limit:
                raise ArtifactInvalid(f"{what}: {length} bytes, more than the {limit} expected")
            yield from iter_body(resp, CHUNK, what, self.deadline)

    def put_blob(self, data: bytes) -> str:
        """Upload `data` (a monolithic upload: POST, then PUT with the digest); its digest."""
        digest = digest_of(data)
        head = self.request("HEAD", self.url(f"blobs/{digest}"))
        self.release(head)
        if head.status_code == 200:
            return digest
        start = self.request("POST", self.url("blobs/uploads/"))
        with start:
            check(start, f"starting an upload to {self.settings.repository}")
            location = start.headers.get("Location", "")
            self.release(start)
        target = urljoin(self.settings.base + "/", location)
        target += ("&" if "?" in target else "?") + f"digest={digest}"
        done = self.request("PUT", target, data=data,
                            headers={"Content-Type": "application/octet-stream"})
        with done:
            check(done, f"uploading {digest} to {self.settings.repository}")
            self.release(done)
        return digest

    def put_manifest(self, reference: str, body: bytes) -> str:
        resp = self.request("PUT", self.url(f"manifests/{reference}"), data=body,
                            headers={"Content-Type": MANIFEST_MEDIA_TYPE})
        with resp:
            check(resp, f"pushing {self.settings.reference(reference)}")
            self.release(resp)
        return digest_of(body)


def _joined(base: str, reference: str, said: str) -> str:
    """`reference` (a Location or a token realm the registry sent) resolved against `base`;
    one urllib cannot parse is the registry's failure, not this process's."""
    try:
        joined = urljoin(base, reference)
        urlsplit(joined).port  # noqa: B018 - parsing the port is what raises for a bad netloc
    except ValueError as exc:
        raise RegistryUnavailable(
            f"{redact_url(base)} {said} {reference[:200]!r}, which is not a URL ({exc})"
        ) from None
    return joined
