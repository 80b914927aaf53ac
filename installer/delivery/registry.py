"""Compiled kernel modules as OCI artifacts: find, pull (verified) and push through oras-py.

One artifact holds the modules built for one key (driver version, kernel release, flavour,
architecture, signing key identity). Its config blob lists every file with its SHA-256 and the
key; its layers are the files. A node loads an artifact only when the config's key equals its
own and every file's digest verifies; vermagic is checked by the caller (installer.prebuilt).

The only user of the registry library (oras), imported lazily. oras-py's own retry decorator
sleeps up to minutes on a dead registry; we call its undecorated request method with
timeouts, so a down registry costs one failed connect and the node compiles instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.delivery.transport import innermost_reason
from installer.errors import ArtifactInvalid, RegistryAuthFailed, RegistryUnavailable

if TYPE_CHECKING:
    import requests

log = logging.getLogger("installer.registry")

CONFIG_MEDIA_TYPE = "application/vnd.nvidia-driver-installer.modules.config.v1+json"
MODULE_MEDIA_TYPE = "application/vnd.nvidia-driver-installer.kernel-module.v1"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
ANNOTATION_PREFIX = "io.github.nvidia-driver-installer."
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ArtifactKey:
    """What a module set was built for; equal keys mean interchangeable modules."""

    version: str
    kernel: str
    flavour: str
    arch: str
    signing: str = "unsigned"  # or "sha256:<hex of the signing certificate>"

    def fields(self) -> dict[str, str]:
        return {
            "version": self.version,
            "kernel": self.kernel,
            "flavour": self.flavour,
            "arch": self.arch,
            "signing": self.signing,
        }

    def tag(self) -> str:
        """A tag naming the key (tags allow [A-Za-z0-9_.-], 128 characters)."""
        signing = "unsigned" if self.signing == "unsigned" else "key-" + self.signing[7:19]
        raw = f"{self.version}-{self.kernel}-{self.flavour}-{self.arch}-{signing}"
        tag = _TAG_UNSAFE.sub("_", raw)
        if len(tag) > 128:
            tag = tag[:111] + "-" + hashlib.sha256(raw.encode()).hexdigest()[:16]
        return tag


def signing_identity(cert: bytes | None) -> str:
    """The signing key identity of an artifact: the certificate's SHA-256, or unsigned."""
    return "sha256:" + hashlib.sha256(cert).hexdigest() if cert else "unsigned"


@dataclass(frozen=True)
class RegistrySettings:
    """Where artifacts live: `host[:port]/repository`, and how to reach it."""

    repository: str
    plain_http: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    connect_timeout: float = 5.0
    read_timeout: float = 60.0

    def reference(self, tag_or_digest: str) -> str:
        sep = "@" if tag_or_digest.startswith("sha256:") else ":"
        return f"{self.repository}{sep}{tag_or_digest}"


@dataclass(frozen=True)
class Artifact:
    """An artifact found in the registry: its reference, manifest digest and file list."""

    reference: str
    digest: str
    files: tuple[tuple[str, str, int], ...]  # (name, sha256, size)


# --------------------------------------------------------------------------- the client


def _client(settings: RegistrySettings) -> Any:
    import oras.provider
    import requests

    timeout = (settings.connect_timeout, settings.read_timeout)

    class _Session(requests.Session):
        def request(self, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
            kwargs.setdefault("timeout", timeout)
            return super().request(*args, **kwargs)

    class _Registry(oras.provider.Registry):  # type: ignore[misc]
        def do_request(self, *args: Any, **kwargs: Any) -> requests.Response:
            # The undecorated method: no sleeps of 3**n seconds on a dead registry.
            undecorated = oras.provider.Registry.do_request.__wrapped__
            return undecorated(self, *args, **kwargs)  # type: ignore[no-any-return]

    host = settings.repository.split("/", 1)[0]
    session = _Session()
    session.trust_env = True
    # The API root says how this registry authenticates (distribution spec: GET /v2/): Basic
    # (htpasswd) or Bearer tokens (most hosted registries). It also fails fast when the
    # registry is down, before any other work.
    scheme = "http" if settings.plain_http else "https"
    probe = session.get(f"{scheme}://{host}/v2/")
    probe.close()
    challenge = probe.headers.get("Www-Authenticate", "")
    if probe.status_code == 401 and not settings.username:
        raise RegistryAuthFailed(f"{host} asks for credentials ({challenge.split(' ')[0]})")
    backend = "basic" if challenge.lower().startswith("basic") else "token"
    registry = _Registry(hostname=host, insecure=settings.plain_http, auth_backend=backend)
    session.cookies.set_policy(registry.session.cookies._policy)
    registry.session = session
    registry.auth.session = session
    if settings.username:
        registry.auth.set_basic_auth(settings.username, settings.password or "")
    return registry


def _call(settings: RegistrySettings, what: str, fn: Any) -> Any:
    """Runs one registry operation, mapping every failure to our errors (never a traceback)."""
    import requests

    try:
        return fn()
    except (RegistryUnavailable, ArtifactInvalid):
        raise
    except requests.exceptions.RequestException as exc:
        raise RegistryUnavailable(f"{what}: {innermost_reason(exc)}") from None
    except Exception as exc:  # oras raises ValueError/AuthenticationException for auth
        text = str(exc) or type(exc).__name__
        if "authenticat" in text.lower() or "401" in text:
            raise RegistryAuthFailed(f"{what}: the registry asks for credentials: {text}") from None
        raise RegistryUnavailable(f"{what}: {text}") from None


def _check(resp: requests.Response, what: str) -> None:
    if resp.status_code in (401, 403):
        raise RegistryAuthFailed(f"{what}: HTTP {resp.status_code} {resp.reason or ''}".rstrip())
    if not 200 <= resp.status_code < 300:
        raise RegistryUnavailable(f"{what}: HTTP {resp.status_code} {resp.reason or ''}".rstrip())


# --------------------------------------------------------------------------- find and pull


def find(settings: RegistrySettings, key: ArtifactKey) -> Artifact | None:
    """The artifact for exactly `key`, or None (no such tag, or one built for another key).

    Reads the registry only. Raises RegistryUnavailable / RegistryAuthFailed / ArtifactInvalid.
    """
    ref = settings.reference(key.tag())

    def lookup() -> Artifact | None:
        registry = _client(settings)
        manifest_url = f"{registry.prefix}://{_container(registry, ref).manifest_url()}"
        resp = registry.do_request(manifest_url, "GET", headers={"Accept": MANIFEST_MEDIA_TYPE})
        if resp.status_code == 404:
            return None
        _check(resp, f"manifest {ref}")
        body = resp.content
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        claimed = resp.headers.get("Docker-Content-Digest")
        if claimed and claimed != digest:
            raise ArtifactInvalid(
                f"manifest {ref}: served with digest {claimed}, hashes to {digest}"
            )
        manifest = json.loads(body)
        config = _read_config(registry, settings, manifest, ref)
        if config.get("key") != key.fields():
            log.warning("artifact %s was built for %s, not %s: not used", ref,
                        config.get("key"), key.fields())
            return None
        files = tuple((str(f["name"]), str(f["sha256"]), int(f["size"])) for f in config["files"])
        return Artifact(settings.reference(digest), digest, files)

    result: Artifact | None = _call(settings, f"looking up {ref}", lookup)
    return result


def _container(registry: Any, ref: str) -> Any:
    return registry.get_container(ref)


def _read_config(
    registry: Any, settings: RegistrySettings, manifest: Any, ref: str
) -> dict[str, Any]:
    try:
        config_desc = manifest["config"]
        if config_desc.get("mediaType") != CONFIG_MEDIA_TYPE:
            raise ArtifactInvalid(f"{ref} is not a module artifact (config {config_desc})")
        raw = _blob_bytes(registry, ref, config_desc["digest"], 1 << 20)
        config = json.loads(raw)
        layers = {layer["digest"]: layer for layer in manifest["layers"]}
        for entry in config["files"]:
            name = entry["name"]
            if "/" in name or name in ("", ".", "..") or not name.endswith(".ko"):
                raise ArtifactInvalid(f"{ref}: unsafe file name {name!r} in the artifact")
            if "sha256:" + entry["sha256"] not in layers:
                raise ArtifactInvalid(f"{ref}: {name} has no layer with its digest")
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactInvalid(f"{ref}: malformed manifest or config ({exc})") from None
    return dict(config)


def _blob_bytes(registry: Any, ref: str, digest: str, limit: int) -> bytes:
    resp = registry.get_blob(_container(registry, ref), digest, stream=True)
    with resp:
        _check(resp, f"blob {digest} of {ref}")
        data = resp.raw.read(limit + 1)
    if len(data) > limit:
        raise ArtifactInvalid(f"{ref}: blob {digest} is larger than {limit} bytes")
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise ArtifactInvalid(f"{ref}: blob {digest} does not hash to its digest")
    return bytes(data)


def pull(settings: RegistrySettings, artifact: Artifact, dest: Path) -> list[Path]:
    """Download every file of `artifact` (by digest) into the empty directory `dest`.

    Each file is hashed while written; a mismatch raises ArtifactInvalid (files stay in `dest`
    for the caller to drop). Writes only under `dest`. Raises RegistryUnavailable as well.
    """
    written: list[Path] = []

    def download() -> list[Path]:
        registry = _client(settings)
        container = _container(registry, artifact.reference)
        for name, sha256, size in artifact.files:
            target = dest / name
            digest = hashlib.sha256()
            got = 0
            resp = registry.get_blob(container, "sha256:" + sha256, stream=True)
            with resp:
                _check(resp, f"blob of {name} in {artifact.reference}")
                with target.open("wb") as out:
                    for chunk in resp.iter_content(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        got += len(chunk)
                        if got > size:
                            break
                    out.flush()
                    os.fsync(out.fileno())
            written.append(target)
            if got != size or digest.hexdigest() != sha256:
                raise ArtifactInvalid(
                    f"{name} from {artifact.reference}: expected {size} bytes with SHA-256 "
                    f"{sha256}, got {got} bytes with {digest.hexdigest()}"
                )
        return written

    result: list[Path] = _call(settings, f"pulling {artifact.reference}", download)
    return result


# --------------------------------------------------------------------------- push


def push(settings: RegistrySettings, key: ArtifactKey, files: list[Path]) -> Artifact:
    """Publish `files` (the .ko of one build) as the artifact of `key`; returns what was pushed.

    Reads the files; writes a config file beside nothing (a temporary directory). Raises
    RegistryUnavailable / RegistryAuthFailed.
    """
    import tempfile

    entries: list[dict[str, Any]] = []
    for path in sorted(files, key=lambda p: p.name):
        data_hash = hashlib.sha256()
        size = 0
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(_CHUNK), b""):
                data_hash.update(block)
                size += len(block)
        entries.append({"name": path.name, "sha256": data_hash.hexdigest(), "size": size})
    config = {"key": key.fields(), "files": entries}
    ref = settings.reference(key.tag())

    def upload() -> Artifact:
        registry = _client(settings)
        with tempfile.TemporaryDirectory(prefix="installer-artifact-") as tmp:
            config_path = Path(tmp) / "modules.json"
            config_path.write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
            resp = registry.push(
                target=ref,
                files=[f"{p}:{MODULE_MEDIA_TYPE}" for p in sorted(files, key=lambda p: p.name)],
                manifest_config=f"{config_path}:{CONFIG_MEDIA_TYPE}",
                manifest_annotations={ANNOTATION_PREFIX + k: v for k, v in key.fields().items()},
                disable_path_validation=True,
                quiet=True,
            )
        _check(resp, f"pushing {ref}")
        digest = resp.headers.get("Docker-Content-Digest", "")
        files_t = tuple((str(e["name"]), str(e["sha256"]), int(e["size"])) for e in entries)
        return Artifact(settings.reference(digest) if digest else ref, digest, files_t)

    result: Artifact = _call(settings, f"pushing {ref}", upload)
    log.info("published %s (%s)", ref, result.digest)
    return result
