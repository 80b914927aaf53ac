"""Module artifacts as OCI manifests: what one holds, its size limits, and the checks that make
one usable: a publisher's signature over its manifest digest, the operator's pinned digests,
NVIDIA's module names only, every digest and size. Pure: bytes in, verdicts out (the network
is installer.delivery.registry's).

One artifact holds the modules built for one key (driver version, kernel release, flavour,
architecture, Secure Boot signing certificate). Its config blob lists every file with its
SHA-256 and the key; its layers are the files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from installer.delivery import trust
from installer.delivery.checksums import is_sha256_hex
from installer.delivery.oci import MANIFEST_MEDIA_TYPE, Client, RegistrySettings, digest_of
from installer.errors import ArtifactInvalid, ArtifactUntrusted

CONFIG_MEDIA_TYPE = "application/vnd.nvidia-driver-installer.modules.config.v1+json"
MODULE_MEDIA_TYPE = "application/vnd.nvidia-driver-installer.headers.trees-module.v1"
ANNOTATION_PREFIX = "io.github.nvidia-driver-installer."
# The modules NVIDIA's driver builds; nothing else may reach /lib/modules through an artifact.
MODULE_NAMES = frozenset({"nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko",
                          "nvidia-peermem.ko"})
MANIFEST_LIMIT = 256 << 10  # ours are ~2 KB; cosign's signature manifests ~1 KB per signature
CONFIG_LIMIT = 256 << 10
LAYER_LIMIT = 512 << 20  # one module (NVIDIA's largest is ~100 MB unstripped)
TOTAL_LIMIT = 1 << 30
SIGNATURE_LAYERS = 32


@dataclass(frozen=True)
class ArtifactKey:
    """What a module set was built for; equal keys mean interchangeable modules."""

    version: str
    kernel: str
    flavour: str
    arch: str
    signing: str = "unsigned"  # or "sha256:<hex of the Secure Boot signing certificate>"

    def fields(self) -> dict[str, str]:
        return {"version": self.version, "kernel": self.kernel, "flavour": self.flavour,
                "arch": self.arch, "signing": self.signing}

    def tag(self) -> str:
        """A tag naming the key (tags allow [A-Za-z0-9_.-], 128 characters)."""
        signing = "unsigned" if self.signing == "unsigned" else "key-" + self.signing[7:19]
        raw = f"{self.version}-{self.kernel}-{self.flavour}-{self.arch}-{signing}"
        tag = re.sub(r"[^A-Za-z0-9_.-]", "_", raw)
        if len(tag) > 128:
            tag = tag[:111] + "-" + hashlib.sha256(raw.encode()).hexdigest()[:16]
        return tag


def signing_identity(cert: bytes | None) -> str:
    """The Secure Boot signing identity of an artifact: the certificate's SHA-256, or unsigned."""
    return "sha256:" + hashlib.sha256(cert).hexdigest() if cert else "unsigned"


@dataclass(frozen=True)
class ModuleFile:
    name: str
    sha256: str  # hex
    size: int


@dataclass(frozen=True)
class Policy:
    """What an operator trusts: publisher keys, and optionally exact manifest digests."""

    trust: trust.TrustRoot
    digests: tuple[str, ...] = ()


@dataclass(frozen=True)
class Evidence:
    """The signed bytes that made an artifact trusted; kept beside pulled modules so they can
    be checked again, against the trust root of the day, before every use."""

    repository: str
    manifest: bytes
    config: bytes
    payload: bytes
    signature: str

    @property
    def digest(self) -> str:
        return digest_of(self.manifest)

    def to_json(self) -> str:
        b64 = base64.b64encode
        return json.dumps({"repository": self.repository,
                           "manifest": b64(self.manifest).decode(),
                           "config": b64(self.config).decode(),
                           "payload": b64(self.payload).decode(),
                           "signature": self.signature}, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Evidence:
        try:
            data = json.loads(text)
            return cls(str(data["repository"]), base64.b64decode(data["manifest"]),
                       base64.b64decode(data["config"]), base64.b64decode(data["payload"]),
                       str(data["signature"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ArtifactInvalid(f"unreadable artifact record ({exc})") from None


@dataclass(frozen=True)
class Artifact:
    """A verified artifact: where it is, what it holds, who signed it."""

    reference: str  # repository@sha256:...
    digest: str
    key: dict[str, str]
    files: tuple[ModuleFile, ...]
    signer: str
    evidence: Evidence


def load_json(data: bytes, what: str) -> dict[str, Any]:
    """A registry document as a JSON object. Raises ArtifactInvalid for anything else."""
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise ArtifactInvalid(f"{what} is not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise ArtifactInvalid(f"{what} is not a JSON object")
    return document


def descriptor(desc: Any, what: str, limit: int) -> tuple[str, int, str]:
    """An OCI descriptor's digest, size (at most `limit`) and media type. Raises
    ArtifactInvalid."""
    if not isinstance(desc, dict):
        raise ArtifactInvalid(f"{what}: a descriptor is not an object")
    digest, size, media = desc.get("digest"), desc.get("size"), desc.get("mediaType")
    if not (isinstance(digest, str) and digest.startswith("sha256:")
            and is_sha256_hex(digest[7:])):
        raise ArtifactInvalid(f"{what}: bad digest {digest!r}")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= limit:
        raise ArtifactInvalid(f"{what}: size {size!r} is not within 0..{limit}")
    return digest, size, str(media)


def check_pinned(digest: str, policy: Policy, ref: str) -> None:
    if policy.digests and digest not in policy.digests:
        raise ArtifactUntrusted(f"{ref} is {digest}, not one of the digests pinned in "
                                "NVIDIA_MODULE_DIGESTS")


class Signed(NamedTuple):
    """A manifest a trusted key signed and its config blob: the reference by digest, the
    manifest's layers as its `layers_of` reads them, and the evidence that vouched for it."""

    ref: str
    layers: Any
    signer: str
    evidence: Evidence


def signed_manifest(client: Client, settings: RegistrySettings, tag: str, policy: Policy,
                    layers_of: Callable[[bytes, str], tuple[tuple[str, int], Any]]
                    ) -> Signed | None:
    """The manifest at `tag` and its config blob, once its digest is pinned (if pins are set),
    `layers_of` accepts it (media types and sizes, before anything else is read) and a trusted
    key signed it; None when there is no such tag. Raises ArtifactUntrusted, ArtifactInvalid,
    RegistryUnavailable and its subclasses."""
    manifest = client.get_manifest(tag, MANIFEST_LIMIT)
    if manifest is None:
        return None
    digest = digest_of(manifest)
    ref = settings.reference(digest)
    check_pinned(digest, policy, ref)
    (config_digest, config_size), layers = layers_of(manifest, ref)
    payload, signature, signer = trusted_signature(digest, signatures(client, digest, ref),
                                                   policy, ref)
    config = client.get_blob(config_digest, config_size)
    return Signed(ref, layers, signer,
                  Evidence(settings.repository, manifest, config, payload, signature))


def signatures(client: Client, digest: str, ref: str) -> list[tuple[bytes, str]]:
    """(payload, base64 signature) of each cosign signature stored for `digest`: what a module
    or user-space artifact is trusted by. Reads the registry."""
    manifest = client.get_manifest(trust.signature_tag(digest), MANIFEST_LIMIT)
    if manifest is None:
        return []
    signed = []
    for payload_digest, size, signature in signature_candidates(manifest, ref):
        signed.append((client.get_blob(payload_digest, size), signature))
    return signed


def signature_candidates(signature_manifest: bytes, ref: str) -> list[tuple[str, int, str]]:
    """(payload digest, size, base64 signature) of every cosign signature layer."""
    document = load_json(signature_manifest, f"signature manifest of {ref}")
    layers = document.get("layers")
    if not isinstance(layers, list):
        raise ArtifactInvalid(f"signature manifest of {ref} has no layers")
    found = []
    for layer in layers[:SIGNATURE_LAYERS]:
        digest, size, media = descriptor(layer, f"signature of {ref}", trust.PAYLOAD_LIMIT)
        annotations = layer.get("annotations") or {}
        signature = annotations.get(trust.SIGNATURE_ANNOTATION) if isinstance(
            annotations, dict) else None
        if media == trust.PAYLOAD_MEDIA_TYPE and isinstance(signature, str):
            found.append((digest, size, signature))
    return found


def trusted_signature(digest: str, signed: list[tuple[bytes, str]], policy: Policy,
                      ref: str) -> tuple[bytes, str, str]:
    """The first (payload, signature, signer) that a trusted key made over `digest` for the
    repository of `ref` (`repository@digest`, where the artifact was pulled from). Raises
    ArtifactUntrusted naming why none does."""
    if not signed:
        raise ArtifactUntrusted(f"{ref} has no cosign signature ({trust.signature_tag(digest)})")
    repository = ref.rsplit("@", 1)[0]
    elsewhere: list[str] = []
    for payload, signature in signed:
        signer = policy.trust.verify(payload, signature)
        if signer is None or trust.signed_digest(payload) != digest:
            continue
        if trust.names_repository(payload, repository):
            return payload, signature, signer
        elsewhere.append(str(trust.signed_repository(payload)))
    if elsewhere:
        raise ArtifactUntrusted(
            f"the signature of {ref} by a trusted key names {', '.join(sorted(set(elsewhere)))}, "
            f"not {repository}: a build signed for another repository (copied with its .sig) "
            "is not used; promote it by signing it for this one")
    raise ArtifactUntrusted(f"none of the {len(signed)} signature(s) of {ref} is by a key in "
                            f"{policy.trust.describe()} over {digest}")


def layers_of(manifest: bytes, ref: str) -> tuple[tuple[str, int], dict[str, int]]:
    """The config descriptor (digest, size) and the module layers {digest: size}, checked
    against the media types and the size limits."""
    document = load_json(manifest, f"manifest {ref}")
    if document.get("mediaType", MANIFEST_MEDIA_TYPE) != MANIFEST_MEDIA_TYPE:
        raise ArtifactInvalid(f"{ref} is a {document.get('mediaType')}, not an OCI manifest")
    digest, size, media = descriptor(document.get("config"), f"config of {ref}", CONFIG_LIMIT)
    if media != CONFIG_MEDIA_TYPE:
        raise ArtifactInvalid(f"{ref} is not a module artifact (config {media})")
    layers = document.get("layers")
    if not isinstance(layers, list) or not 0 < len(layers) <= len(MODULE_NAMES):
        raise ArtifactInvalid(f"{ref}: {len(layers) if isinstance(layers, list) else 'no'} "
                              f"layers, not 1..{len(MODULE_NAMES)} modules")
    found: dict[str, int] = {}
    for layer in layers:
        layer_digest, layer_size, layer_media = descriptor(layer, f"layer of {ref}",
                                                            LAYER_LIMIT)
        if layer_media != MODULE_MEDIA_TYPE:
            raise ArtifactInvalid(f"{ref}: a layer of type {layer_media}, not a module")
        found[layer_digest] = layer_size
    if sum(found.values()) > TOTAL_LIMIT:
        raise ArtifactInvalid(f"{ref}: the modules add up to more than {TOTAL_LIMIT} bytes")
    return (digest, size), found


def config_key(config: bytes, described: tuple[str, int], ref: str) -> tuple[dict[str, str], Any]:
    """The key an artifact's config blob names, and its "files", once the blob is the one the
    manifest describes (`described`: digest, size). Raises ArtifactInvalid."""
    if (digest_of(config), len(config)) != described:
        raise ArtifactInvalid(f"{ref}: the config blob does not match the manifest")
    document = load_json(config, f"config of {ref}")
    key = document.get("key")
    if not isinstance(key, dict) or not all(isinstance(v, str) for v in key.values()):
        raise ArtifactInvalid(f"{ref}: the config names no key")
    return key, document.get("files")


def contents(manifest: bytes, config: bytes, ref: str) -> tuple[dict[str, str],
                                                                 tuple[ModuleFile, ...]]:
    """The key and the files of an artifact whose config blob is `config`: NVIDIA's module
    names only, each once, each matching a layer of the manifest and every layer a file."""
    config_desc, layers = layers_of(manifest, ref)
    key, entries = config_key(config, config_desc, ref)
    if not isinstance(entries, list):
        raise ArtifactInvalid(f"{ref}: the config lists no files")
    files: list[ModuleFile] = []
    for entry in entries:
        try:
            item = ModuleFile(str(entry["name"]), str(entry["sha256"]), int(entry["size"]))
        except (KeyError, TypeError, ValueError):
            raise ArtifactInvalid(f"{ref}: malformed file entry {entry!r}") from None
        if item.name not in MODULE_NAMES:
            raise ArtifactInvalid(f"{ref}: {item.name!r} is not one of NVIDIA's modules "
                                  f"({', '.join(sorted(MODULE_NAMES))})")
        if layers.get("sha256:" + item.sha256) != item.size:
            raise ArtifactInvalid(f"{ref}: {item.name} has no layer of its digest and size")
        files.append(item)
    names = [f.name for f in files]
    if len(set(names)) != len(names) or "nvidia.ko" not in names:
        raise ArtifactInvalid(f"{ref}: the modules {names} are not one nvidia.ko and its "
                              "companions, each once")
    if {"sha256:" + f.sha256 for f in files} != set(layers):
        raise ArtifactInvalid(f"{ref}: a layer is no listed module")
    return dict(key), tuple(files)


def verify(evidence: Evidence, policy: Policy) -> Artifact:
    """Check recorded (or freshly fetched) bytes end to end: pinned digest, signature by a
    trusted key over the manifest digest, then the contents. Raises ArtifactUntrusted or
    ArtifactInvalid."""
    digest = evidence.digest
    ref = f"{evidence.repository}@{digest}"
    check_pinned(digest, policy, ref)
    _, _, signer = trusted_signature(digest, [(evidence.payload, evidence.signature)], policy,
                                     ref)
    key, files = contents(evidence.manifest, evidence.config, ref)
    return Artifact(ref, digest, key, files, signer, evidence)


def manifest_for(config: bytes, files: list[ModuleFile], key: ArtifactKey) -> bytes:
    """The artifact manifest of `files` (sorted by name) and its config blob."""
    document = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": digest_of(config),
                   "size": len(config)},
        "layers": [{"mediaType": MODULE_MEDIA_TYPE, "digest": "sha256:" + f.sha256,
                    "size": f.size,
                    "annotations": {"org.opencontainers.image.title": f.name}}
                   for f in sorted(files, key=lambda f: f.name)],
        "annotations": {ANNOTATION_PREFIX + k: v for k, v in key.fields().items()},
    }
    return json.dumps(document, indent=1, sort_keys=True).encode()


def config_for(key: ArtifactKey, files: list[ModuleFile]) -> bytes:
    document = {"key": key.fields(),
                "files": [{"name": f.name, "sha256": f.sha256, "size": f.size}
                          for f in sorted(files, key=lambda f: f.name)]}
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def signature_manifest(existing: bytes | None, payload: bytes, signature: str,
                       config: bytes) -> bytes:
    """cosign's signature manifest with our signature added to the ones already there."""
    layers: list[Any] = []
    if existing is not None:
        try:
            old = json.loads(existing).get("layers")
            layers = [layer for layer in old if isinstance(layer, dict)] if isinstance(
                old, list) else []
        except (ValueError, AttributeError):
            layers = []
    ours = {"mediaType": trust.PAYLOAD_MEDIA_TYPE, "digest": digest_of(payload),
            "size": len(payload), "annotations": {trust.SIGNATURE_ANNOTATION: signature}}
    if ours not in layers:
        layers.append(ours)
    document = {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
                "config": {"mediaType": trust.SIGNATURE_CONFIG_MEDIA_TYPE,
                           "digest": digest_of(config), "size": len(config)},
                "layers": layers[-SIGNATURE_LAYERS:]}
    return json.dumps(document, separators=(",", ":")).encode()
