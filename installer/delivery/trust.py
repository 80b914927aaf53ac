"""Who published a module artifact: cosign's key-based signatures, made and checked here.

The scheme is cosign's (sigstore/cosign specs/SIGNATURE_SPEC.md), so an operator can sign with
`cosign sign --key` in CI and verify with `cosign verify --key`: a simple-signing payload naming
the manifest digest, signed with the publisher's private key (ECDSA P-256/P-384 with SHA-256,
RSA PKCS#1 v1.5 with SHA-256, or Ed25519), base64 in the layer annotation
`dev.cosignproject.cosign/signature` of an OCI manifest stored at the tag `sha256-<hex>.sig`.
The trust root is a PEM file of public keys or certificates (a certificate is a pinned key
here: no chain, no expiry, as with `cosign verify --key` on a certificate's key).

The only user of the `cryptography` package, imported lazily (docs/deploy.md says why).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.errors import TrustRootInvalid

PAYLOAD_MEDIA_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIGNATURE_TYPE = "cosign container image signature"
SIGNATURE_CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
PAYLOAD_LIMIT = 64 << 10
KEY_FILE_LIMIT = 1 << 20  # a trust root of a few hundred keys is ~100 KB
ACCEPTED = "ECDSA P-256/P-384, RSA or Ed25519"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def signature_tag(digest: str) -> str:
    """Where cosign keeps the signatures of `digest`: `sha256-<hex>.sig`."""
    return digest.replace(":", "-", 1) + ".sig"


def payload(repository: str, digest: str) -> bytes:
    """The simple-signing payload for `repository@digest`, byte for byte as cosign writes it
    (Go's encoding/json: struct order, no spaces, `optional` null)."""
    document = {
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest},
            "type": SIGNATURE_TYPE,
        },
        "optional": None,
    }
    return json.dumps(document, separators=(",", ":")).encode()


def signed_digest(data: bytes) -> str | None:
    """The manifest digest a simple-signing payload vouches for, or None when the payload is
    not a cosign image signature. Where it may be used is `names_repository`'s question."""
    try:
        document = json.loads(data)
        critical = document["critical"]
        if critical["type"] != SIGNATURE_TYPE:
            return None
        digest = critical["image"]["docker-manifest-digest"]
    except (ValueError, KeyError, TypeError):
        return None
    return digest if isinstance(digest, str) and _DIGEST.fullmatch(digest) else None


def signed_repository(data: bytes) -> str | None:
    """The repository a simple-signing payload was signed for (its docker-reference), or None."""
    try:
        reference = json.loads(data)["critical"]["identity"]["docker-reference"]
    except (ValueError, KeyError, TypeError):
        return None
    return reference if isinstance(reference, str) and reference else None


# cosign names Docker Hub repositories by go-containerregistry's canonical registry name.
_DOCKER_HUB = {"docker.io", "registry-1.docker.io", "index.docker.io"}


def _canonical(repository: str) -> str:
    """`host[:port]/path` with the host in lower case, Docker Hub's aliases as one, and a tag
    or digest (which older cosign releases kept in the docker-reference) dropped."""
    repository = repository.split("@", 1)[0]
    host, _, path = repository.partition("/")
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path = path[: len(path) - len(last)] + last.split(":", 1)[0]
    host = host.lower()
    return f"{'index.docker.io' if host in _DOCKER_HUB else host}/{path}"


def names_repository(data: bytes, repository: str) -> bool:
    """Whether the payload was signed for `repository` (`host[:port]/path`): a signature copied
    with its artifact into another repository (staging into production) vouches for nothing
    there, as a `cosign verify` of the production reference would say."""
    signed = signed_repository(data)
    return signed is not None and _canonical(signed) == _canonical(repository)


def signature_config(payload_digest: str) -> bytes:
    """The config blob of cosign's signature manifest (an empty image with one layer)."""
    document = {
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": [payload_digest]},
        "config": {},
    }
    return json.dumps(document, separators=(",", ":")).encode()


def fingerprint(key: Any) -> str:
    """`sha256:<first 16 hex>` of a public key's SubjectPublicKeyInfo, for logs."""
    from cryptography.hazmat.primitives import serialization

    der = key.public_bytes(serialization.Encoding.DER,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()[:16]


@dataclass(frozen=True)
class TrustRoot:
    """The publisher keys an operator trusts."""

    source: str
    keys: tuple[Any, ...]

    def verify(self, data: bytes, signature_b64: str) -> str | None:
        """The fingerprint of the key whose signature over `data` this is, or None."""
        try:
            signature = base64.b64decode(signature_b64, validate=True)
        except ValueError:
            return None
        for key in self.keys:
            if _verifies(key, data, signature):
                return fingerprint(key)
        return None

    def describe(self) -> str:
        return f"{self.source} ({', '.join(fingerprint(k) for k in self.keys)})"


def _verifies(key: Any, data: bytes, signature: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, data)
        else:
            return False
    except (InvalidSignature, ValueError):
        return False
    return True


def _read(path: Path, setting: str) -> bytes:
    try:
        with path.open("rb") as handle:
            data = handle.read(KEY_FILE_LIMIT + 1)  # never more, whatever the file holds
    except OSError as exc:
        raise TrustRootInvalid(f"{setting}={path}: {exc.strerror or exc}") from None
    if len(data) > KEY_FILE_LIMIT:
        raise TrustRootInvalid(f"{setting}={path}: larger than 1 MiB, not a key file")
    return data


@dataclass(frozen=True)
class PemBlock:
    kind: str  # PUBLIC KEY, CERTIFICATE, ...
    line: int  # where its BEGIN line is, from 1
    text: bytes  # BEGIN to END, as the library reads it

    def name(self, number: int) -> str:
        return f"block {number} ({self.kind}, line {self.line})"


def pem_blocks(data: bytes, where: str) -> list[PemBlock]:
    """The PEM blocks of `data`, found by one pass over its lines (text outside blocks is
    ignored, as openssl does). Raises TrustRootInvalid for a block with no END line."""
    blocks: list[PemBlock] = []
    kind: str | None = None
    start = 0
    lines: list[bytes] = []
    for number, raw in enumerate(data.splitlines(), 1):
        line = raw.strip()
        if kind is None:
            if line.startswith(b"-----BEGIN ") and line.endswith(b"-----") and len(line) > 16:
                kind = line[11:-5].decode("ascii", "replace")
                start = number
                lines = [line]
            continue
        lines.append(line)
        if line.startswith(b"-----END "):
            if line != f"-----END {kind}-----".encode():
                raise TrustRootInvalid(f"{where}: the {kind} block at line {start} ends with "
                                       f"{line[:80].decode('ascii', 'replace')!r}")
            blocks.append(PemBlock(kind, start, b"\n".join(lines) + b"\n"))
            kind = None
    if kind is not None:
        raise TrustRootInvalid(f"{where}: the {kind[:80]} block at line {start} has no END line")
    return blocks


def load_trust_root(path: Path) -> TrustRoot:
    """Every PUBLIC KEY and CERTIFICATE block of a PEM file. Raises TrustRootInvalid naming the
    block that is not a key of an accepted algorithm."""
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    where = f"NVIDIA_MODULE_TRUSTED_KEYS={path}"
    keys: list[Any] = []
    for number, block in enumerate(pem_blocks(_read(path, "NVIDIA_MODULE_TRUSTED_KEYS"), where),
                                   1):
        name = block.name(number)
        if block.kind not in ("PUBLIC KEY", "RSA PUBLIC KEY", "CERTIFICATE"):
            raise TrustRootInvalid(f"{where}: {name} is no public key or certificate")
        try:
            if block.kind == "CERTIFICATE":
                key: Any = x509.load_pem_x509_certificate(block.text).public_key()
            else:
                key = serialization.load_pem_public_key(block.text)
        except UnsupportedAlgorithm as exc:
            raise TrustRootInvalid(f"{where}: {name} is a key of an algorithm not accepted "
                                   f"({exc}); accepted: {ACCEPTED}") from None
        except ValueError as exc:
            raise TrustRootInvalid(f"{where}: unreadable {block.kind} in {name}: {exc}"
                                   ) from None
        if not isinstance(key, (ec.EllipticCurvePublicKey, rsa.RSAPublicKey,
                                ed25519.Ed25519PublicKey)):
            algorithm = type(key).__name__.replace("PublicKey", "").lstrip("_")
            raise TrustRootInvalid(f"{where}: {name} is a {algorithm or 'unknown'} key; "
                                   f"accepted: {ACCEPTED}")
        keys.append(key)
    if not keys:
        raise TrustRootInvalid(f"{where}: no PEM public key or certificate in it")
    return TrustRoot(str(path), tuple(keys))


@dataclass(frozen=True)
class Signer:
    """The builder's private key."""

    source: str
    key: Any

    def sign(self, data: bytes) -> str:
        """The base64 signature of `data`, as cosign stores it."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

        if isinstance(self.key, ec.EllipticCurvePrivateKey):
            raw = self.key.sign(data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(self.key, rsa.RSAPrivateKey):
            raw = self.key.sign(data, padding.PKCS1v15(), hashes.SHA256())
        else:
            raw = self.key.sign(data)
        return base64.b64encode(raw).decode()

    def fingerprint(self) -> str:
        return fingerprint(self.key.public_key())


def load_signer(path: Path) -> Signer:
    """An unencrypted PEM private key. Raises TrustRootInvalid."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    setting = "NVIDIA_MODULE_PUBLISHER_KEY"
    data = _read(path, setting)
    if b"ENCRYPTED SIGSTORE PRIVATE KEY" in data or b"ENCRYPTED COSIGN PRIVATE KEY" in data:
        raise TrustRootInvalid(
            f"{setting}={path} is in cosign's own encrypted format, which only cosign reads",
            hint="Make the key with openssl (`openssl genpkey -algorithm EC -pkeyopt "
            "ec_paramgen_curve:P-256 -out publisher.pem`), give that file to the builder and "
            "`cosign import-key-pair --key publisher.pem` for cosign (docs/deploy.md).")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise TrustRootInvalid(f"{setting}={path} is encrypted; the builder needs it "
                               "unencrypted (keep it in a Secret)") from None
    except ValueError as exc:
        raise TrustRootInvalid(f"{setting}={path}: not a PEM private key ({exc})") from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey,
                            ed25519.Ed25519PrivateKey)):
        raise TrustRootInvalid(f"{setting}={path}: unsupported key type {type(key).__name__}")
    return Signer(str(path), key)
