"""Getting bytes onto the node: HTTP with mirrors, retries, resume, checksums and the cache.

The only package that imports requests and tenacity; both are imported inside functions so
that `installer --help` and the warm path never pay for them. Other rooms import from here
only (docs/architecture.md's door rule): the names below, each loading its module on first
use (config and the planner redact URLs on every run without loading the download
machinery), and the few modules other rooms use whole.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from installer.delivery.artifact import (
        MODULE_NAMES,
        Artifact,
        ArtifactKey,
        Policy,
        signing_identity,
    )
    from installer.delivery.cache import find_cached
    from installer.delivery.checksums import Expected, file_sha256, parse_sha256sum
    from installer.delivery.fetch import fetch_file
    from installer.delivery.oci import RegistrySettings
    from installer.delivery.settings import DownloadSettings, Fetched, VerifiedBy
    from installer.delivery.small import fetch_bytes
    from installer.delivery.trust import Signer, load_signer, load_trust_root
    from installer.delivery.unpack import extract
    from installer.delivery.urls import SUPPORTED_SCHEMES, control_character, redact_url
    from installer.delivery.userspace_artifact import UserspaceArtifact, UserspaceKey
    from installer.delivery.vouch import fetch_listing, find_vouched

# name -> the module of this package that defines it
_EXPORTS = {
    "MODULE_NAMES": "artifact",
    "Artifact": "artifact",
    "ArtifactKey": "artifact",
    "Policy": "artifact",
    "signing_identity": "artifact",
    "find_cached": "cache",
    "Expected": "checksums",
    "file_sha256": "checksums",
    "parse_sha256sum": "checksums",
    "fetch_file": "fetch",
    "RegistrySettings": "oci",
    "DownloadSettings": "settings",
    "Fetched": "settings",
    "VerifiedBy": "settings",
    "fetch_bytes": "small",
    "Signer": "trust",
    "load_signer": "trust",
    "load_trust_root": "trust",
    "extract": "unpack",
    "SUPPORTED_SCHEMES": "urls",
    "control_character": "urls",
    "redact_url": "urls",
    "UserspaceArtifact": "userspace_artifact",
    "UserspaceKey": "userspace_artifact",
    "find_vouched": "vouch",
    "fetch_listing": "vouch",
}

# The names above, and the modules other rooms use whole (`from installer.delivery import
# registry`).
__all__ = [
    "MODULE_NAMES",
    "SUPPORTED_SCHEMES",
    "Artifact",
    "ArtifactKey",
    "DownloadSettings",
    "Expected",
    "Fetched",
    "Policy",
    "RegistrySettings",
    "Signer",
    "UserspaceArtifact",
    "UserspaceKey",
    "VerifiedBy",
    "artifact",
    "control_character",
    "digests",
    "extract",
    "fetch_bytes",
    "fetch_file",
    "fetch_listing",
    "file_sha256",
    "find_cached",
    "find_vouched",
    "load_signer",
    "load_trust_root",
    "parse_sha256sum",
    "redact_url",
    "registry",
    "signing_identity",
    "userspace_artifact",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
