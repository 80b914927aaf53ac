"""A driver's user space (nvidia-smi, its libraries and firmware, as `install-userspace` places
them) in the registry of the module artifacts: one signed artifact per driver version and
architecture, so a node whose modules come from the registry needs no `.run` at all.

Trusted exactly as a module artifact is (installer.delivery.artifact): the operator's pins, a
cosign signature by a key of the trust root over the manifest digest, a config blob that hashes
to what the manifest says and names this version and architecture. The config lists every
file with its SHA-256, size and mode and every symlink's target; the one layer is a gzip'd
ustar of exactly that listing, hashed as it streams in and unpacked at the same time
(installer.delivery.userspace_tar) into a staging directory the caller drops on any error.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.delivery import trust
from installer.delivery.artifact import (
    ANNOTATION_PREFIX,
    Evidence,
    Policy,
    config_key,
    descriptor,
    load_json,
    signed_manifest,
)
from installer.delivery.oci import (
    MANIFEST_MEDIA_TYPE,
    Client,
    RegistrySettings,
    budget,
    digest_of,
)
from installer.delivery.userspace_tar import Entry, Unpacker, check_entries, pack, scan
from installer.errors import ArtifactInvalid, RegistryUnavailable

CONFIG_MEDIA_TYPE = "application/vnd.nvidia-driver-installer.userspace.config.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_LIMIT = 4 << 20  # a listing of ~200 files is ~40 KB
LAYER_LIMIT = 2 << 30
TOTAL_LIMIT = 4 << 30  # the unpacked tree (NVIDIA's 535 user space is ~0.5 GB)
ENTRY_LIMIT = 20000

log = logging.getLogger("installer.registry")


@dataclass(frozen=True)
class UserspaceKey:
    """What a user space was installed from: the driver version and the architecture."""

    version: str
    arch: str

    def fields(self) -> dict[str, str]:
        return {"content": "userspace", "version": self.version, "arch": self.arch}

    def tag(self) -> str:
        raw = f"{self.version}-userspace-{self.arch}"
        return "".join(c if c.isalnum() or c in "_.-" else "_" for c in raw)[:128]


@dataclass(frozen=True)
class UserspaceArtifact:
    """A verified user-space artifact: where, what it holds, who signed it."""

    reference: str
    digest: str
    key: dict[str, str]
    entries: tuple[Entry, ...]
    layer: tuple[str, int]  # digest, size
    signer: str
    evidence: Evidence


def _descriptor(desc: Any, what: str, limit: int, media: str) -> tuple[str, int]:
    if not isinstance(desc, dict) or desc.get("mediaType") != media:
        raise ArtifactInvalid(f"{what} is not a {media}")
    digest, size, _ = descriptor(desc, what, limit)
    return digest, size


def layers_of(manifest: bytes, ref: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """The config and the one layer (digest, size) of a user-space manifest."""
    document = load_json(manifest, f"manifest {ref}")
    if document.get("mediaType", MANIFEST_MEDIA_TYPE) != MANIFEST_MEDIA_TYPE:
        raise ArtifactInvalid(f"{ref} is not an OCI manifest")
    config = _descriptor(document.get("config"), f"config of {ref}", CONFIG_LIMIT,
                         CONFIG_MEDIA_TYPE)
    layers = document.get("layers")
    if not isinstance(layers, list) or len(layers) != 1:
        raise ArtifactInvalid(f"{ref}: a user-space artifact has one layer")
    return config, _descriptor(layers[0], f"layer of {ref}", LAYER_LIMIT, LAYER_MEDIA_TYPE)


def _entry(raw: Any, ref: str) -> Entry:
    try:
        kind = str(raw["type"])
        if kind == "symlink":
            return Entry(str(raw["path"]), kind, target=str(raw["target"]))
        mode = raw["mode"]
        if not isinstance(mode, int) or isinstance(mode, bool):
            raise TypeError("mode")
        if kind == "file":
            size = raw["size"]
            if not isinstance(size, int) or isinstance(size, bool):
                raise TypeError("size")
            return Entry(str(raw["path"]), kind, mode, size, str(raw["sha256"]))
        return Entry(str(raw["path"]), kind, mode)
    except (KeyError, TypeError):
        raise ArtifactInvalid(f"{ref}: malformed file entry {str(raw)[:200]!r}") from None


def contents(manifest: bytes, config: bytes, ref: str) -> tuple[dict[str, str],
                                                                 tuple[Entry, ...]]:
    """The key and the listing of a user-space artifact whose config blob is `config`."""
    config_desc, _ = layers_of(manifest, ref)
    key, files = config_key(config, config_desc, ref)
    if not isinstance(files, list) or not 0 < len(files) <= ENTRY_LIMIT:
        raise ArtifactInvalid(f"{ref}: the config lists no files (or more than {ENTRY_LIMIT})")
    entries = check_entries([_entry(raw, ref) for raw in files], ref)
    if sum(e.size for e in entries) > TOTAL_LIMIT:
        raise ArtifactInvalid(f"{ref}: the files add up to more than {TOTAL_LIMIT} bytes")
    return dict(key), tuple(entries)


def config_for(key: UserspaceKey, entries: list[Entry]) -> bytes:
    document = {"key": key.fields(), "files": [e.to_json() for e in entries]}
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def manifest_for(config: bytes, layer: bytes, key: UserspaceKey) -> bytes:
    document = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": digest_of(config),
                   "size": len(config)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": digest_of(layer),
                    "size": len(layer)}],
        "annotations": {ANNOTATION_PREFIX + k: v for k, v in key.fields().items()},
    }
    return json.dumps(document, indent=1, sort_keys=True).encode()


# --------------------------------------------------------------------------- the registry


def published(settings: RegistrySettings, key: UserspaceKey, signer: trust.Signer) -> bool:
    """Whether the key's tag holds an artifact for `key` that `signer` signed (what nodes
    trusting it would use). Anything else there (a forgery, another key's, a malformed one)
    is to be replaced. Raises RegistryUnavailable and its other subclasses."""
    from installer.errors import ArtifactUntrusted

    root = trust.TrustRoot(signer.source, (signer.key.public_key(),))
    try:
        return find(settings, key, Policy(root)) is not None
    except (ArtifactUntrusted, ArtifactInvalid) as exc:
        log.warning("the registry's %s is not ours (error[%s]: %s): publishing over it",
                    settings.reference(key.tag()), exc.reference, exc.message)
        return False


def find(settings: RegistrySettings, key: UserspaceKey, policy: Policy
         ) -> UserspaceArtifact | None:
    """The trusted user-space artifact for exactly `key`, or None (no such tag). Raises
    ArtifactUntrusted, ArtifactInvalid (also for one made for another version or
    architecture), RegistryUnavailable and its other subclasses."""
    client = Client(settings)
    try:
        client.probe()
        signed = signed_manifest(client, settings, key.tag(), policy, layers_of)
        if signed is None:
            return None
        ref, evidence = signed.ref, signed.evidence
        found_key, entries = contents(evidence.manifest, evidence.config, ref)
        if found_key != key.fields():
            raise ArtifactInvalid(f"{ref} at {key.tag()} holds the user space of {found_key}, "
                                  f"not {key.fields()}")
        return UserspaceArtifact(ref, evidence.digest, found_key, entries, signed.layers,
                                 signed.signer, evidence)
    finally:
        client.close()


def pull(settings: RegistrySettings, artifact: UserspaceArtifact, dest: Path) -> int:
    """Stream the layer of a verified `artifact` into the empty directory `dest`: hashed as
    it arrives, unpacked at once, checked against the listing. Returns the layer's size.
    Raises ArtifactInvalid, RegistryUnavailable; `dest` is the caller's to drop then."""
    digest, size = artifact.layer
    unpacker = Unpacker(dest, list(artifact.entries), artifact.reference)
    hashed = hashlib.sha256()
    got = 0
    client = Client(settings, budget(settings, size))
    try:
        for chunk in _bounded(client.stream_blob(digest, size), size, artifact.reference):
            hashed.update(chunk)
            got += len(chunk)
            unpacker.feed(chunk)
        if got != size or "sha256:" + hashed.hexdigest() != digest:
            raise ArtifactInvalid(f"the layer of {artifact.reference}: expected {size} bytes "
                                  f"with {digest}, got {got} with sha256:{hashed.hexdigest()}")
        unpacker.finish()
    except OSError as exc:
        raise RegistryUnavailable(f"unpacking into {dest}: {exc.strerror or exc}") from None
    finally:
        unpacker.close()
        client.close()
    return got


def _bounded(chunks: Iterator[bytes], size: int, ref: str) -> Iterator[bytes]:
    got = 0
    for chunk in chunks:
        got += len(chunk)
        if got > size:
            raise ArtifactInvalid(f"the layer of {ref} is longer than its {size} bytes")
        yield chunk


def push(settings: RegistrySettings, key: UserspaceKey, tree: Path, paths: list[str],
         signer: trust.Signer, level: int = 1) -> UserspaceArtifact:
    """Publish `paths` of `tree` as the user-space artifact of `key`, signed by `signer`.
    Raises ArtifactInvalid (a member a node would refuse), RegistryUnavailable."""
    from installer.delivery import registry  # the module artifact's push, signed the same way

    entries = scan(tree, paths)
    layer = pack(tree, entries, level)
    config = config_for(key, entries)
    manifest = manifest_for(config, layer, key)
    digest = digest_of(manifest)
    ref = settings.reference(digest)
    contents(manifest, config, ref)  # what nodes will check: refuse to publish anything else
    evidence = registry.push_signed(settings, signer, key.tag(), manifest, config, (layer,),
                                    len(layer))
    log.info("published the user space %s (%s, %d files, layer %.1f MB), signed by %s",
             settings.reference(key.tag()), digest, len(entries), len(layer) / 1e6,
             signer.fingerprint())
    return UserspaceArtifact(ref, digest, key.fields(), tuple(entries),
                             (digest_of(layer), len(layer)), signer.fingerprint(), evidence)
