"""A real OCI registry for tests: Debian's `docker-registry` (CNCF distribution) on 127.0.0.1
with htpasswd authentication and filesystem storage we can inspect (and damage)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from installer.delivery.oci import RegistrySettings

USER, PASSWORD = "robot", "s3cr3t-pa55"


def require_registry() -> str:
    binary = shutil.which("docker-registry")
    if binary is None:
        message = "docker-registry is not installed (apt-get install docker-registry)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


def _bcrypt(password: str) -> str:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # removed in Python 3.13; the registry accepts bcrypt only

    # Cost 4 (16 rounds): the registry checks the hash on every request; cost 12 made the
    # tests 10x slower.
    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Registry:
    """One registry process; `repository(name)` gives `127.0.0.1:<port>/<name>`."""

    def __init__(self, workdir: Path) -> None:
        self.binary = require_registry()
        self.workdir = workdir
        self.storage = workdir / "storage"
        self.port = _free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Registry:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "htpasswd").write_text(f"{USER}:{_bcrypt(PASSWORD)}\n")
        config = self.workdir / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: error\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
            f"auth:\n  htpasswd:\n    realm: test\n    path: {self.workdir / 'htpasswd'}\n"
        )
        log = (self.workdir / "registry.log").open("wb")
        self.proc = subprocess.Popen([self.binary, "serve", str(config)], stdout=log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1)
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"docker-registry did not start: {(self.workdir / 'registry.log')}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def repository(self, name: str) -> str:
        return f"{self.host}/{name}"

    def settings(self, name: str) -> RegistrySettings:
        """The installer's client settings for repository `name` here: plain http, USER."""
        from installer.delivery.oci import RegistrySettings

        return RegistrySettings(self.repository(name), plain_http=True, username=USER,
                                password=PASSWORD)

    def blob_path(self, digest: str) -> Path:
        """Where the filesystem driver keeps a blob's bytes (distribution's storage layout)."""
        hexdigest = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"


# --- publisher keys, and an attacker who can push but holds no key (push is not trust) ---


def make_key_pair(directory: Path, name: str = "publisher") -> tuple[Path, Path]:
    """An ECDSA P-256 key pair as `openssl genpkey` / `cosign public-key` write them:
    (private PKCS#8 PEM, public SubjectPublicKeyInfo PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    directory.mkdir(parents=True, exist_ok=True)
    private = directory / f"{name}.pem"
    public = directory / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    private.chmod(0o600)
    return private, public


def http_push(host: str, name: str, tag: str, blobs: list[bytes], manifest: bytes,
              auth: tuple[str, str] = (USER, PASSWORD)) -> str:
    """Push blobs and a manifest through the registry's HTTP API (distribution spec: POST an
    upload, PUT it with its digest, PUT the manifest), as anyone holding push credentials can.
    Returns the manifest's digest."""
    import hashlib

    import requests

    base = f"http://{host}/v2/{name}"
    with requests.Session() as session:
        session.auth = auth
        for blob in blobs:
            digest = "sha256:" + hashlib.sha256(blob).hexdigest()
            start = session.post(f"{base}/blobs/uploads/", timeout=30)
            assert start.status_code == 202, start.text
            location = start.headers["Location"]
            if location.startswith("/"):
                location = f"http://{host}{location}"
            sep = "&" if "?" in location else "?"
            done = session.put(f"{location}{sep}digest={digest}", data=blob, timeout=60,
                               headers={"Content-Type": "application/octet-stream"})
            assert done.status_code == 201, done.text
        put = session.put(f"{base}/manifests/{tag}", data=manifest, timeout=30,
                          headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        assert put.status_code == 201, put.text
    return "sha256:" + hashlib.sha256(manifest).hexdigest()
