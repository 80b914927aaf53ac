"""A small OCI distribution client (the registry HTTP API) on requests: manifests and blobs
read with size limits, uploads, and authentication the installer keeps in its own hands.

Authentication follows the distribution spec and Docker's token spec: a 401 names the scheme.
Basic: the credentials go to the registry itself, and only there. Bearer: a token is fetched
from the challenge's realm, which must be the registry's own scheme and host, or an https
service the operator listed (NVIDIA_MODULE_REGISTRY_TOKEN_REALMS); any other realm is refused
before a byte is sent to it. Credentials are never read from ~/.docker/config.json, a
credential helper or ORAS_* variables: only from the settings.

Why not oras-py, which issue 14 used: its token flow sends Basic credentials to whatever realm
a registry names, it reads manifests whole, and its retry decorator sleeps for minutes on a
dead registry.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from installer.delivery.transport import innermost_reason, no_auth, session_class
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
_CHUNK = 1 << 20
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


def read_bounded(resp: requests.Response, limit: int, what: str) -> bytes:
    """The body, read in chunks and abandoned past `limit` bytes (never held whole)."""
    length = resp.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > limit:
        raise ArtifactInvalid(f"{what}: {length} bytes, more than the {limit} allowed")
    chunks: list[bytes] = []
    got = 0
    for chunk in resp.iter_content(min(_CHUNK, limit + 1)):
        chunks.append(chunk)
        got += len(chunk)
        if got > limit:
            raise ArtifactInvalid(f"{what}: more than the {limit} bytes allowed")
    return b"".join(chunks)


class Client:
    """One registry, one repository, one session."""

    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        self.session = session_class()()
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

    # ----------------------------------------------------------------- requests

    def url(self, path: str) -> str:
        return f"{self.settings.base}/v2/{self.settings.name}/{path}"

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                data: bytes | None = None, stream: bool = False) -> requests.Response:
        """One call, authenticated as the registry asks (at most one challenge answered)."""
        import requests

        timeout = (self.settings.connect_timeout, self.settings.read_timeout)
        for attempt in range(2):
            sent = dict(headers or {})
            auth = self._authorization(url)
            if auth:
                sent["Authorization"] = auth
            try:
                resp = self.session.request(method, url, headers=sent, data=data,
                                            stream=stream, timeout=timeout,
                                            allow_redirects=True)
            except requests.exceptions.RequestException as exc:
                raise RegistryUnavailable(f"{method} {url}: {innermost_reason(exc)}") from None
            if resp.status_code != 401 or attempt == 1:
                return resp
            challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
            resp.close()
            self._answer(challenge, url)
        raise AssertionError("unreachable")

    def _authorization(self, url: str) -> str | None:
        if urlsplit(url).netloc != self.settings.host:
            return None  # a redirect target (blob storage) gets no credentials
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
        import requests

        realm = urljoin(self.settings.base + "/", params["realm"])
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
        except requests.exceptions.RequestException as exc:
            raise RegistryUnavailable(f"token from {realm}: {innermost_reason(exc)}") from None
        with resp:
            if resp.status_code in (401, 403):
                raise RegistryAuthFailed(f"the token service {realm} refused "
                                         f"(HTTP {resp.status_code})")
            check(resp, f"token from {realm}")
            try:
                answer = json.loads(read_bounded(resp, TOKEN_LIMIT, f"token from {realm}"))
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

    def get_manifest(self, reference: str, limit: int) -> bytes | None:
        """The manifest's bytes (at most `limit`), or None when there is none (404)."""
        ref = self.settings.reference(reference)
        resp = self.request("GET", self.url(f"manifests/{reference}"),
                            headers={"Accept": MANIFEST_MEDIA_TYPE}, stream=True)
        with resp:
            if resp.status_code == 404:
                return None
            check(resp, f"manifest {ref}")
            body = read_bounded(resp, limit, f"manifest {ref}")
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
            body = read_bounded(resp, limit, what)
        if digest_of(body) != digest:
            raise ArtifactInvalid(f"{what} does not hash to its digest")
        return body

    def stream_blob(self, digest: str) -> Iterator[bytes]:
        """A blob's chunks as they arrive (the caller hashes and bounds them)."""
        resp = self.request("GET", self.url(f"blobs/{digest}"), stream=True)
        with resp:
            check(resp, f"blob {digest} of {self.settings.repository}")
            yield from resp.iter_content(_CHUNK)

    def put_blob(self, data: bytes) -> str:
        """Upload `data` (a monolithic upload: POST, then PUT with the digest); its digest."""
        digest = digest_of(data)
        head = self.request("HEAD", self.url(f"blobs/{digest}"))
        head.close()
        if head.status_code == 200:
            return digest
        start = self.request("POST", self.url("blobs/uploads/"))
        with start:
            check(start, f"starting an upload to {self.settings.repository}")
            location = start.headers.get("Location", "")
        target = urljoin(self.settings.base + "/", location)
        target += ("&" if "?" in target else "?") + f"digest={digest}"
        done = self.request("PUT", target, data=data,
                            headers={"Content-Type": "application/octet-stream"})
        with done:
            check(done, f"uploading {digest} to {self.settings.repository}")
        return digest

    def put_manifest(self, reference: str, body: bytes) -> str:
        resp = self.request("PUT", self.url(f"manifests/{reference}"), data=body,
                            headers={"Content-Type": MANIFEST_MEDIA_TYPE})
        with resp:
            check(resp, f"pushing {self.settings.reference(reference)}")
        return digest_of(body)


def check(resp: Any, what: str) -> None:
    if resp.status_code in (401, 403):
        raise RegistryAuthFailed(f"{what}: HTTP {resp.status_code} {resp.reason or ''}".rstrip())
    if not 200 <= resp.status_code < 300:
        raise RegistryUnavailable(f"{what}: HTTP {resp.status_code} {resp.reason or ''}".rstrip())
