"""Getting NVIDIA's .run by URL: its name and the URLs to try, the fetch functions the plan is
given, and `installer download`. Kept light (the delivery stack is imported when a fetch
starts): `installer download` imports this, not the planner and its steps."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from installer.config import Config

log = logging.getLogger(__name__)

FetchBytes = Callable[[str], bytes]
FetchRunfile = Callable[[list[str], Path, str], Path]
# What `installer download --dest DIR` writes beside the files: the operator's digests file.
DIGESTS_NAME = "digests"


def runfile_name(version: str, arch: str) -> str:
    return f"NVIDIA-Linux-{arch}-{version}.run"


def download_urls(config: Config, version: str, arch: str, default_url: str) -> list[str]:
    """URLs to try in order: an explicit URL alone, else each mirror's
    `<mirror>/<v>/<runfile>`, then the default (catalog or GKE layout)."""
    if config.download_url:
        return [config.download_url]
    name = runfile_name(version, arch)
    urls = [f"{mirror.rstrip('/')}/{version}/{name}" for mirror in config.mirrors]
    urls.append(default_url)
    return urls


def download_settings(config: Config, *, keep_cached: bool = True) -> Any:
    from installer import delivery

    return delivery.DownloadSettings(
        retries=config.retries,
        connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout,
        allow_unverified=config.allow_unverified,
        keep_cached=keep_cached,
        digests_file=config.digests_file,
        trusted_origins=config.trusted_origins,
    )


def fetch_bytes_for(config: Config) -> FetchBytes:
    def fetch(url: str) -> bytes:
        from installer import delivery

        return delivery.fetch_bytes(url, download_settings(config), max_bytes=64 << 20)

    return fetch


def fetch_runfile_for(config: Config, *, keep_cached: bool = True) -> FetchRunfile:
    """`keep_cached=False` where nothing reads the file soon after (the node extracts its .run
    at once, from the page cache; a prefetch for a mirror does not)."""

    def fetch(urls: list[str], dest_dir: Path, filename: str) -> Path:
        from installer import delivery

        settings = download_settings(config, keep_cached=keep_cached)
        fetched = delivery.fetch_file(urls, dest_dir, filename, sha256=config.sha256,
                                      settings=settings)
        return Path(fetched.path)

    return fetch


def cached_runfile(config: Config, dest_dir: Path, name: str) -> bool:
    """Whether a cached .run is there that fetch_runfile would use (read-only, no network)."""
    from installer import delivery

    return delivery.find_vouched(dest_dir, name, config.sha256,
                                 download_settings(config)) is not None


def digest_source(config: Config, name: str, checksum_urls: list[str], *,
                  pinned: bool = True) -> str:
    """Where the SHA-256 of `name` will come from, for `installer plan`: the pin (`pinned`:
    the .run's), the digests file, the first checksum URL on a trusted origin, or nothing (the
    run would refuse)."""
    from installer.delivery import digests, redact_url
    from installer.errors import DigestsFileInvalid

    if pinned and config.sha256:
        return "NVIDIA_DRIVER_SHA256 (pin)"
    if config.digests_file is not None:
        try:
            if digests.listed_in(config.digests_file, name) is not None:
                return f"digests file {config.digests_file}"
        except DigestsFileInvalid as exc:  # a plan reports it; the run raises it
            return f"none: {exc.message}"
    for url in checksum_urls:
        if digests.is_trusted(url, config.trusted_origins):
            return f"{redact_url(url)} (a trusted origin, over TLS, if published there)"
        if url.startswith("file:"):
            return (f"{redact_url(url)} when present (a file:// source is the operator's own "
                    "and needs none)")
    if config.allow_unverified:
        return "none: NVIDIA_DRIVER_ALLOW_UNVERIFIED=true (used unverified)"
    return ("none: no pin, no digests-file entry, no trusted https origin among the sources: "
            "the run refuses (download-unverified)")


def record_digest(dest: Path, path: Path, sha256: str) -> Path:
    """Add `path`'s entry to `dest`/digests (kept entries of other files), atomically."""
    from installer.delivery import digests
    from installer.hostroot import write_atomic

    target = dest / DIGESTS_NAME
    entries = digests.read_digests(target) if target.exists() else {}
    entries[path.name] = digests.Listed(sha256, path.stat().st_size)
    write_atomic(target, digests.format_digests(entries))
    log.info("wrote %s: ship it to the nodes as NVIDIA_DRIVER_DIGESTS_FILE (a ConfigMap)",
             target)
    return target


def download_runfile(config: Config, dest: Path, arch: str) -> Path:
    """Prefetch the planned .run into `dest` for air-gapped nodes (no host facts needed), and
    add its SHA-256 and size to `dest`/digests, the digests file nodes that use `dest` as a
    mirror are given."""
    from installer.release import catalog, versions

    loaded = catalog.load(config.catalog, fetch_bytes_for(config))
    resolution = versions.resolve(config.version, loaded, (), track=config.track)
    default_url = versions.runfile_url(resolution.version, arch, config.branch_path,
                                       catalog=loaded)
    urls = download_urls(config, resolution.version, arch, default_url)
    name = runfile_name(resolution.version, arch)
    log.info("downloading %s (%s)", name, "; ".join(resolution.reasons))
    from installer import delivery

    fetched = delivery.fetch_file(urls, dest, name, sha256=config.sha256,
                                  settings=download_settings(config, keep_cached=False))
    if fetched.verified_by == "none" and not fetched.source.startswith("file:"):
        # Taken on NVIDIA_DRIVER_ALLOW_UNVERIFIED: the nodes must not take a mirror's bytes as
        # the operator's word, which an entry in the digests file would be.
        log.warning("%s: nothing vouched for it, so it was not added to %s; once you have "
                    "checked it, pin it (NVIDIA_DRIVER_SHA256 or --sha256) and run this again",
                    name, dest / DIGESTS_NAME)
    else:
        record_digest(dest, Path(fetched.path), fetched.sha256)
    return Path(fetched.path)
