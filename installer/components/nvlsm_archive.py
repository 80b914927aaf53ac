"""NVLSM from NVIDIA's redist trees: which archive (the driver's redistrib JSON, or a pinned
version), fetched through installer/delivery under the same trust rules as Fabric Manager, and
its files beside Fabric Manager's in versions/<ver>/."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from installer import safefs
from installer.components import fm_archive
from installer.config import Config
from installer.dirs import mark_complete
from installer.errors import (
    DownloadForbidden,
    DownloadNotFound,
    NvlsmMismatch,
    NvlsmUnavailable,
)
from installer.layout import Layout

log = logging.getLogger(__name__)

COMPONENT_KEY = "nvlsm"
INSTALLED_MARKER = ".nvlsm-version"
# NVLSM is versioned by date, apart from the driver (2025.10.12).
VERSION = r"^\d{4}\.\d{2}\.\d+$"
_SHA256 = r"^[0-9a-f]{64}$"


def archive_name(version: str, arch: str) -> str:
    return f"{COMPONENT_KEY}-{fm_archive.PLATFORMS[arch]}-{version}-archive.tar.xz"


def relative_path(version: str, arch: str) -> str:
    """Its place under CUDA's redist tree (NVIDIA_NVLSM_REDIST)."""
    return f"{COMPONENT_KEY}/{fm_archive.PLATFORMS[arch]}/{archive_name(version, arch)}"


def share_dir(layout: Layout, driver: str) -> Path:
    return layout.version_dir(driver) / "share" / "nvidia" / "nvlsm"


def binary(layout: Layout, driver: str) -> Path:
    return layout.version_dir(driver) / "bin" / "nvlsm"


def config_file(layout: Layout, driver: str) -> Path:
    return share_dir(layout, driver) / "nvlsm.conf"


def installed(layout: Layout, driver: str) -> str | None:
    """The NVLSM version installed beside driver `driver` (its marker names the version and
    what it came from), or None."""
    try:
        text = (share_dir(layout, driver) / INSTALLED_MARKER).read_text()
    except OSError:
        return None
    found = re.fullmatch(r"(\d{4}\.\d{2}\.\d+)\n[0-9a-f]{64}\n", text)
    if found is None or not binary(layout, driver).is_file():
        return None
    return found.group(1)


class Listed(NamedTuple):
    version: str
    relative_path: str
    sha256: str | None  # from a redistrib JSON; None for a pinned version
    size: int | None
    bases: tuple[str, ...]  # the trees that hold relative_path
    where: str  # what named it (for messages)
    trusted: bool = False


def parse_entry(data: bytes, arch: str, where: str) -> Listed | None:
    """The nvlsm entry for `arch` of a redistrib JSON, or None when it lists none. Raises
    NvlsmMismatch for an entry that is not a well-formed NVLSM archive of its version."""
    try:
        document: Any = json.loads(data)
    except ValueError as exc:
        raise NvlsmMismatch(f"{where} is not JSON: {exc}") from None
    entry = document.get(COMPONENT_KEY) if isinstance(document, dict) else None
    platform = fm_archive.PLATFORMS[arch]
    if not isinstance(entry, dict) or not isinstance(entry.get(platform), dict):
        return None
    version = str(entry.get("version", ""))
    item = entry[platform]
    relative = str(item.get("relative_path", ""))
    path = PurePosixPath(relative)
    if (re.match(VERSION, version) is None or path.is_absolute() or ".." in path.parts
            or path.name != archive_name(version, arch)):
        raise NvlsmMismatch(f"{where}: nvlsm {version!r} for {platform} names {relative!r}, "
                            "not an NVLSM archive of that version")
    sha256 = str(item.get("sha256", "")).lower()
    size = str(item.get("size", ""))
    if not re.match(_SHA256, sha256) or not size.isdigit():
        raise NvlsmMismatch(f"{where}: nvlsm for {platform} has no valid sha256 and size")
    return Listed(version, relative, sha256, int(size), (), where)


def locate(config: Config, driver: str, arch: str) -> Listed:
    """NVIDIA_NVLSM_VERSION when set (under NVIDIA_NVLSM_REDIST), else the nvlsm entry of the
    driver's redistrib_<driver>.json (the first base of NVIDIA_FABRICMANAGER_REDIST that
    lists it, a trusted origin preferred). Raises NvlsmUnavailable when neither names one."""
    from installer import delivery
    from installer.delivery import digests

    if config.nvlsm_version:
        version = config.nvlsm_version
        return Listed(version, relative_path(version, arch), None, None, config.nvlsm_redist,
                      "NVIDIA_NVLSM_VERSION")
    settings = fm_archive.download_settings(config)
    found: Listed | None = None
    tried = []
    for base in config.fabricmanager_redist:
        url = fm_archive.manifest_url(base, driver)
        trusted = digests.is_trusted(url, config.trusted_origins)
        if found is not None and not trusted:
            continue
        try:
            data, trusted = delivery.fetch_listing(url, settings, max_bytes=4 << 20)
        except (DownloadNotFound, DownloadForbidden) as exc:
            tried.append(f"{delivery.redact_url(url)} ({exc.message.rsplit(': ', 1)[-1]})")
            continue
        listed = parse_entry(data, arch, delivery.redact_url(url))
        if listed is None:
            tried.append(f"{delivery.redact_url(url)} (lists no nvlsm)")
            continue
        found = listed._replace(trusted=trusted, bases=config.fabricmanager_redist)
        if trusted:
            break
    if found is None:
        raise NvlsmUnavailable(
            f"no NVLSM for driver {driver}: NVIDIA_NVLSM_VERSION is not set and no "
            f"redistrib_{driver}.json lists nvlsm for {fm_archive.PLATFORMS[arch]} "
            f"(tried {'; '.join(tried) or 'nothing'})")
    return found


def digest_source(config: Config, driver: str) -> str:
    """Where the archive and its SHA-256 will come from, for `installer plan`."""
    if config.nvlsm_version:
        return (f"NVLSM {config.nvlsm_version} (NVIDIA_NVLSM_VERSION) from "
                f"{', '.join(config.nvlsm_redist)}; its SHA-256 from NVIDIA_NVLSM_SHA256 or "
                "the digests file (NVIDIA_DRIVER_DIGESTS_FILE)")
    return (f"the nvlsm entry of redistrib_{driver}.json at "
            f"{', '.join(config.fabricmanager_redist)}; its SHA-256 from that JSON when it is "
            "https on a trusted origin, else the digests file")


def fetch(config: Config, layout: Layout, driver: str, arch: str) -> tuple[Listed, Path]:
    """The archive in the download cache, verified against NVIDIA_NVLSM_SHA256, the digests
    file, or the SHA-256 of a redistrib JSON fetched over TLS from a trusted origin. Raises
    UnverifiedDownload when nothing vouches (before any archive byte is fetched)."""
    from installer import delivery
    from installer.delivery.checksums import Expected

    listed = locate(config, driver, arch)
    name = PurePosixPath(listed.relative_path).name
    vouched = None
    if listed.trusted and listed.sha256:
        vouched = Expected(listed.sha256, "trusted-origin", f"listed in {listed.where}",
                           listed.size)
    elif listed.sha256 and config.allow_unverified:
        vouched = Expected(listed.sha256, "none", f"listed in {listed.where}", listed.size)
    urls = [f"{b.rstrip('/')}/{listed.relative_path}" for b in listed.bases]
    # No published .sha256sum beside NVLSM archives: only a pin, the digests file or a trusted
    # JSON vouch (an empty list asks no checksum URL).
    fetched = delivery.fetch_file(urls, layout.downloads, name, within=layout.cache_anchor,
                                  sha256=config.nvlsm_sha256,
                                  checksum_urls=[], settings=fm_archive.download_settings(config),
                                  vouched=vouched)
    log.info("NVLSM %s: %s (sha256 %s, verified by %s)", listed.version, name, fetched.sha256,
             fetched.verified_by)
    return listed, Path(fetched.path)


def unpack_and_install(archive: Path, work: Path, layout: Layout, driver: str,
                       version: str) -> list[str]:
    """Extract `archive` confined to its top directory and place its files (`place`); the
    marker names the archive's SHA-256. Raises ArchiveUnsafe or NvlsmMismatch (no daemon or no
    config)."""
    from installer.delivery.checksums import file_sha256
    from installer.delivery.unpack import extract

    tree = extract(archive, work, archive.name[: -len(".tar.xz")])
    return place(tree, layout, driver, version, file_sha256(archive), archive.name)


# Where NVIDIA's package puts the config files, which name each other by that absolute path
# (nvlsm.conf: `plugin_options -grpc_mgr --config_file /usr/share/nvidia/nvlsm/grpc_mgr.conf`).
PACKAGE_SHARE_DIR = "/usr/share/nvidia/nvlsm/"


def _relocated(data: bytes, share: Path) -> bytes:
    """A config file's references to the package's share directory pointed at `share`, where
    this install keeps them: a container has no /usr/share/nvidia/nvlsm."""
    text = data.decode(errors="replace")
    if PACKAGE_SHARE_DIR not in text:
        return data
    return text.replace(PACKAGE_SHARE_DIR, f"{share}/").encode()


def place(tree: Path, layout: Layout, driver: str, version: str, digest: str, what: str
          ) -> list[str]:
    """Move the nvlsm of `tree` (bin/ or sbin/), its libraries (lib/) and its config files
    (nvlsm.conf and the .conf files beside it, which it names by their packaged path: those
    names are pointed at versions/<driver>/ too) into versions/<driver>/; the
    marker (version, `digest` of what it came from) last. Raises NvlsmMismatch when `tree`
    (`what`, for the message) has no daemon or no nvlsm.conf."""
    daemon = next((p for p in (tree / "bin" / "nvlsm", tree / "sbin" / "nvlsm") if p.is_file()),
                  None)
    conf = next((p for p in (tree / "share" / "nvidia" / "nvlsm" / "nvlsm.conf",
                             tree / "etc" / "nvlsm.conf") if p.is_file()), None)
    if daemon is None or conf is None:
        raise NvlsmMismatch(f"{what} has no bin/nvlsm (or sbin/) and nvlsm.conf")
    final = layout.version_dir(driver)
    moves = [(daemon, binary(layout, driver)), (conf, config_file(layout, driver))]
    for other in sorted(conf.parent.glob("*.conf")):
        if other != conf and other.is_file():
            moves.append((other, share_dir(layout, driver) / other.name))
    for library in sorted((tree / "lib").glob("*.so*")) if (tree / "lib").is_dir() else []:
        moves.append((library, final / "lib64" / library.name))
    placed = []
    share = share_dir(layout, driver)
    for source, dest in moves:
        safefs.place_copy(source, dest, anchor=layout.install_local,
                          transform=(lambda data: _relocated(data, share))
                          if dest.suffix == ".conf" else None)
        placed.append(str(dest.relative_to(final)))
    mark_complete(share_dir(layout, driver), f"{version}\n{digest}\n", INSTALLED_MARKER)
    return placed
