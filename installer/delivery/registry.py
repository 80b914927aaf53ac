"""Compiled kernel modules in an OCI registry: find a trusted artifact, pull it, publish one.

A node uses an artifact only after: its manifest (read with a size limit) hashes to a digest the
operator pinned (when pins are set), a cosign signature by a key of the trust root names that
digest, the config blob hashes to what the manifest says and names the node's key, and every
layer is one of NVIDIA's modules within the size limits (installer.delivery.artifact). The files
are then pulled by digest and hashed while written. A builder publishes: the modules, their
config and manifest at the key's tag, then its signature at cosign's `sha256-<hex>.sig` tag.

Every registry failure is RegistryUnavailable or a subclass, never a traceback: a node compiles.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from installer.delivery import trust
from installer.delivery.artifact import (
    MANIFEST_LIMIT,
    Artifact,
    ArtifactKey,
    Evidence,
    ModuleFile,
    Policy,
    config_for,
    contents,
    layers_of,
    manifest_for,
    signature_manifest,
    signed_manifest,
    signing_identity,
)
from installer.delivery.oci import Client, RegistrySettings, budget, digest_of
from installer.errors import ArtifactInvalid, RegistryUnavailable

__all__ = ["Artifact", "ArtifactKey", "Policy", "RegistrySettings", "find", "pull", "push",
           "signing_identity"]

log = logging.getLogger("installer.registry")
_CHUNK = 1 << 20


def find(settings: RegistrySettings, key: ArtifactKey, policy: Policy) -> Artifact | None:
    """The trusted artifact for exactly `key`, or None (no such tag). Reads the registry only.
    Raises ArtifactUntrusted (unsigned, signed by another key or for another repository, not
    pinned), ArtifactInvalid (malformed, too large, other module names, built for another key),
    RegistryUnavailable / RegistryAuthFailed / RegistryRealmRefused."""
    client = Client(settings)
    try:
        client.probe()
        tag = key.tag()
        ref = settings.reference(tag)
        signed = signed_manifest(client, settings, tag, policy, layers_of)
        if signed is None:
            return None
        evidence, digest = signed.evidence, signed.evidence.digest
        found_key, files = contents(evidence.manifest, evidence.config, signed.ref)
        if found_key != key.fields():
            # The tag is only a lookup; the signed config says what the build is. Another
            # key's build under this tag is a replay (an older signed version re-tagged).
            raise ArtifactInvalid(f"{ref} is {digest}, signed as the build for {found_key}, not "
                                  f"for {key.fields()}: not used (a build re-tagged)")
        return Artifact(signed.ref, digest, found_key, files, signed.signer, evidence)
    finally:
        client.close()


def pull(settings: RegistrySettings, artifact: Artifact, dest: Path) -> list[Path]:
    """Download every file of a verified `artifact` (by digest) into the empty directory
    `dest`, each hashed and counted while written. Writes only under `dest` (a mismatch leaves
    the files there for the caller to drop). The whole pull has the settings' deadline plus a
    second per oci.SLOWEST_RATE bytes. Raises ArtifactInvalid, RegistryUnavailable."""
    client = Client(settings, budget(settings, sum(item.size for item in artifact.files)))
    written: list[Path] = []
    try:
        for item in artifact.files:
            target = dest / item.name
            hashed = hashlib.sha256()
            got = 0
            with target.open("wb") as out:
                written.append(target)
                for chunk in client.stream_blob("sha256:" + item.sha256, item.size):
                    got += len(chunk)
                    if got > item.size:
                        break
                    hashed.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if got != item.size or hashed.hexdigest() != item.sha256:
                raise ArtifactInvalid(
                    f"{item.name} from {artifact.reference}: expected {item.size} bytes with "
                    f"SHA-256 {item.sha256}, got {'more than ' if got > item.size else ''}"
                    f"{got} bytes with {hashed.hexdigest()}")
    except OSError as exc:
        raise RegistryUnavailable(f"writing {dest}: {exc.strerror or exc}") from None
    finally:
        client.close()
    return written


def push(settings: RegistrySettings, key: ArtifactKey, files: list[Path],
         signer: trust.Signer) -> Artifact:
    """Publish `files` (NVIDIA's .ko of one build) as the artifact of `key`, then sign its
    manifest digest with `signer` (cosign's scheme, beside any signatures already there).
    Reads the files. Raises ArtifactInvalid (other module names), RegistryUnavailable and its
    subclasses."""
    blobs: list[tuple[ModuleFile, Path]] = []
    for path in sorted(files, key=lambda p: p.name):
        hashed = hashlib.sha256()
        size = 0
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(_CHUNK), b""):
                hashed.update(block)
                size += len(block)
        blobs.append((ModuleFile(path.name, hashed.hexdigest(), size), path))
    entries = [item for item, _ in blobs]
    config = config_for(key, entries)
    manifest = manifest_for(config, entries, key)
    digest = digest_of(manifest)
    ref = settings.reference(digest)
    contents(manifest, config, ref)  # what nodes will check: refuse to publish anything else
    evidence = push_signed(settings, signer, key.tag(), manifest, config,
                           (path.read_bytes() for _, path in blobs),
                           sum(item.size for item in entries))
    log.info("published %s (%s), signed by %s", settings.reference(key.tag()), digest,
             signer.fingerprint())
    return Artifact(ref, digest, key.fields(), tuple(entries), signer.fingerprint(), evidence)


def push_signed(settings: RegistrySettings, signer: trust.Signer, tag: str, manifest: bytes,
                config: bytes, layers: Iterable[bytes], size: int) -> Evidence:
    """Push `layers` (read as the push reaches them), `config` and `manifest` tagged `tag`, then
    `signer`'s signature of the manifest's digest beside those already there (cosign's
    scheme): the one way a module or user-space artifact is published. Raises
    RegistryUnavailable and its subclasses."""
    digest = digest_of(manifest)
    payload = trust.payload(settings.repository, digest)
    signature = signer.sign(payload)
    client = Client(settings, budget(settings, size))
    try:
        client.probe()
        for layer in layers:
            client.put_blob(layer)
        client.put_blob(config)
        client.put_manifest(tag, manifest)
        sig_tag = trust.signature_tag(digest)
        sig_config = trust.signature_config(digest_of(payload))
        client.put_blob(payload)
        client.put_blob(sig_config)
        existing = client.get_manifest(sig_tag, MANIFEST_LIMIT)
        client.put_manifest(sig_tag, signature_manifest(existing, payload, signature,
                                                        sig_config))
    finally:
        client.close()
    return Evidence(settings.repository, manifest, config, payload, signature)
