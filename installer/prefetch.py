"""Getting NVIDIA's .run by URL: its name and the URLs to try, the fetch functions the plan is
given, and `installer download`. Kept light (the delivery stack is imported when a fetch
starts): `installer download` imports this, not the planner and its steps (issue 19)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from installer.config import Config

log = logging.getLogger(__name__)

FetchBytes = Callable[[str], bytes]
FetchRunfile = Callable[[list[str], Path, str], Path]


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
                                      checksum_urls=None, settings=settings)
        return Path(fetched.path)

    return fetch


def download_runfile(config: Config, dest: Path, arch: str) -> Path:
    """Prefetch the planned .run into `dest` for air-gapped nodes (no host facts needed)."""
    from installer import catalog, versions

    loaded = catalog.load(config.catalog, fetch_bytes_for(config))
    resolution = versions.resolve(config.version, loaded, (), track=config.track)
    default_url = versions.runfile_url(resolution.version, arch, config.branch_path,
                                       catalog=loaded)
    urls = download_urls(config, resolution.version, arch, default_url)
    name = runfile_name(resolution.version, arch)
    log.info("downloading %s (%s)", name, "; ".join(resolution.reasons))
    return fetch_runfile_for(config, keep_cached=False)(urls, dest, name)
