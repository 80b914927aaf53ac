"""What a download may cost and what it produced: DownloadSettings, Fetched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from installer.delivery.progress import ProgressMode, resolve_mode

# NVIDIA's own download hosts: the catalog's (us.), the XFree86 tree that publishes
# .run.sha256sum files, and the redist tree's redistrib_<version>.json.
DEFAULT_TRUSTED_ORIGINS = (
    "https://download.nvidia.com",
    "https://us.download.nvidia.com",
    "https://developer.download.nvidia.com",
)
# A body longer than this is refused when nothing says how large the file is: the largest
# driver .run is about 400 MB, and an endless body must not fill the node's disk.
MAX_DOWNLOAD_BYTES = 4 << 30
# Who vouched for a file's SHA-256 ("local-sha256sum": a file:// checksum beside a file://
# source). "published-sha256sum" is read from records written by older installers (a checksum
# file from whichever server sent the file): never trusted now.
VerifiedBy = Literal["pin", "digests-file", "trusted-origin", "local-sha256sum",
                     "published-sha256sum", "none"]

@dataclass(frozen=True)
class DownloadSettings:
    """How hard to try.

    `retries` counts attempts after the first, per source (mirror). `read_timeout` is the
    longest silence tolerated while waiting for headers or body bytes, not a limit on the whole
    transfer. Backoff before retry n is drawn from [b/2, b], b = min(backoff_max,
    backoff_initial * 2**(n-1)), unless the server's Retry-After (at most retry_after_max) says
    otherwise. `progress`: "auto" (bar on a terminal, else log lines), "log", "bar", "none".
    `keep_cached=False`: the file leaves the page cache as it reaches the disk (for a file
    nothing reads soon after, as `installer download`'s).
    """

    retries: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    # A 429/503 Retry-After up to this many seconds is obeyed; a longer one falls back to backoff.
    retry_after_max: float = 120.0
    progress: ProgressMode = "auto"
    # A file that no pin, digests file or trusted origin vouches for is refused unless this
    # is set; a file:// source (named only in the operator's settings) needs no vouching.
    allow_unverified: bool = False
    # The operator's `<sha256>  <name>  [<size>]` file (installer.delivery.vouch).
    digests_file: Optional[Path] = None
    # https://host[:port] origins whose checksum files (fetched over TLS) may vouch.
    trusted_origins: tuple[str, ...] = DEFAULT_TRUSTED_ORIGINS
    # The most bytes a download may have when nothing lists its size.
    max_bytes: int = MAX_DOWNLOAD_BYTES
    keep_cached: bool = True

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError("retries must be >= 0")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise ValueError("timeouts must be > 0")
        if self.backoff_initial < 0 or self.backoff_max < 0 or self.retry_after_max < 0:
            raise ValueError("backoff values must be >= 0")
        resolve_mode(self.progress)


@dataclass(frozen=True)
class Fetched:
    """A verified (or knowingly unverified) file in the download dir."""

    path: Path
    sha256: str
    source: str  # redacted: safe to log and to store in state records
    bytes_transferred: int
    from_cache: bool
    verified_by: VerifiedBy


