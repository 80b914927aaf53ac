"""Getting bytes onto the node: HTTP with mirrors, retries, resume, checksums and the cache.

The only package that imports requests and tenacity; both are imported inside functions so
that `installer --help` and the warm path never pay for them. Callers import from here only.
"""

from __future__ import annotations

from installer.delivery.cache import find_cached
from installer.delivery.checksums import parse_sha256sum
from installer.delivery.fetch import fetch_file
from installer.delivery.settings import DownloadSettings, Fetched, VerifiedBy
from installer.delivery.small import fetch_bytes
from installer.delivery.urls import SUPPORTED_SCHEMES, redact_url

__all__ = [
    "SUPPORTED_SCHEMES",
    "DownloadSettings",
    "Fetched",
    "VerifiedBy",
    "fetch_bytes",
    "fetch_file",
    "find_cached",
    "parse_sha256sum",
    "redact_url",
]
