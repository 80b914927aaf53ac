"""Getting bytes onto the node: HTTP with mirrors, retries, resume, checksums and the cache.

The only package that imports requests and tenacity; both are imported inside functions so
that `installer --help` and the warm path never pay for them. Callers import from here only.
The names below load their module on first use: importing `installer.delivery.urls` (config
and the planner redact URLs on every run) does not load the download machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from installer.delivery.cache import find_cached
    from installer.delivery.checksums import parse_sha256sum
    from installer.delivery.fetch import fetch_file
    from installer.delivery.settings import DownloadSettings, Fetched, VerifiedBy
    from installer.delivery.small import fetch_bytes
    from installer.delivery.urls import SUPPORTED_SCHEMES, redact_url
    from installer.delivery.vouch import fetch_listing, find_vouched

# name -> the module of this package that defines it
_EXPORTS = {
    "find_cached": "cache",
    "parse_sha256sum": "checksums",
    "fetch_file": "fetch",
    "find_vouched": "vouch",
    "fetch_listing": "vouch",
    "DownloadSettings": "settings",
    "Fetched": "settings",
    "VerifiedBy": "settings",
    "fetch_bytes": "small",
    "SUPPORTED_SCHEMES": "urls",
    "redact_url": "urls",
}

__all__ = [
    "SUPPORTED_SCHEMES",
    "DownloadSettings",
    "Fetched",
    "VerifiedBy",
    "fetch_bytes",
    "fetch_file",
    "fetch_listing",
    "find_cached",
    "find_vouched",
    "parse_sha256sum",
    "redact_url",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
