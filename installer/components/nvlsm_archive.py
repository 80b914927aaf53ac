"""NVLSM from NVIDIA's redist trees: which archive (the driver's redistrib JSON, or a pinned
version), fetched through installer/components/redist under the same trust rules as Fabric
Manager, and its files beside Fabric Manager's in versions/<ver>/."""

from __future__ import annotations

import logging
import re
from pathlib import Path, PurePosixPath

from installer import safefs
from installer.components import redist
from installer.config import Config
from installer.dirs import mark_complete
from installer.errors import NvlsmMismatch, NvlsmUnavailable
from installer.layout import Layout

log = logging.getLogger(__name__)

COMPONENT_KEY = "nvlsm"
INSTALLED_MARKER = ".nvlsm-version"
# NVLSM is versioned by date, apart from the driver (2025.10.12).
VERSION = r"^\d{4}\.\d{2}\.\d+$"


def archive_name(version: str, arch: str) -> str:
    return redist.archive_name(COMPONENT_KEY, version, arch)


def relative_path(version: str, arch: str) -> str:
    """Its place under CUDA's redist tree (NVIDIA_NVLSM_REDIST)."""
    return f"{COMPONENT_KEY}/{redist.PLATFORMS[arch]}/{archive_name(version, arch)}"


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


def parse_entry(data: bytes, arch: str, where: str) -> redist.Listed:
    """The nvlsm entry for `arch` of a redistrib JSON. Raises NvlsmUnavailable (none listed) or
    NvlsmMismatch (an entry that is not a well-formed NVLSM archive of its version)."""

    def archive(version: str, path: PurePosixPath) -> str | None:
        if re.match(VERSION, version) is None or path.name != archive_name(version, arch):
            return "an NVLSM archive of that version"
        return None

    return redist.parse(data, COMPONENT_KEY, arch, where, absent=NvlsmUnavailable,
                        mismatch=NvlsmMismatch, archive=archive)


def locate(config: Config, driver: str, arch: str) -> redist.Listed:
    """NVIDIA_NVLSM_VERSION when set (under NVIDIA_NVLSM_REDIST), else the nvlsm entry of the
    driver's redistrib_<driver>.json (the first base of NVIDIA_FABRICMANAGER_REDIST that
    lists it, a trusted origin preferred). Raises NvlsmUnavailable when neither names one."""
    if config.nvlsm_version:
        version = config.nvlsm_version
        return redist.Listed(version, relative_path(version, arch), None, None,
                             "NVIDIA_NVLSM_VERSION")
    found = redist.lookup(config, driver, lambda data, where: parse_entry(data, arch, where),
                          pass_over=(NvlsmUnavailable,))
    if found.listed is None:
        raise NvlsmUnavailable(
            f"no NVLSM for driver {driver}: NVIDIA_NVLSM_VERSION is not set and no "
            f"redistrib_{driver}.json lists nvlsm for {redist.PLATFORMS[arch]} "
            f"(tried {found.tried or 'nothing'})")
    return found.listed


def digest_source(config: Config, driver: str) -> str:
    """Where the archive and its SHA-256 will come from, for `installer plan`."""
    if config.nvlsm_version:
        return (f"NVLSM {config.nvlsm_version} (NVIDIA_NVLSM_VERSION) from "
                f"{', '.join(config.nvlsm_redist)}; its SHA-256 from NVIDIA_NVLSM_SHA256 or "
                "the digests file (NVIDIA_DRIVER_DIGESTS_FILE)")
    return (f"the nvlsm entry of redistrib_{driver}.json at "
            f"{', '.join(config.fabricmanager_redist)}; its SHA-256 from that JSON when it is "
            "https on a trusted origin, else the digests file")


def fetch(config: Config, layout: Layout, driver: str, arch: str) -> tuple[redist.Listed, Path]:
    """The archive in the download cache, verified against NVIDIA_NVLSM_SHA256, the digests
    file, or the SHA-256 of a redistrib JSON fetched over TLS from a trusted origin. Raises
    UnverifiedDownload when nothing vouches (before any archive byte is fetched)."""
    listed = locate(config, driver, arch)
    # A pinned version lies in CUDA's tree; the driver's JSON names one in the driver's.
    bases = config.nvlsm_redist if config.nvlsm_version else config.fabricmanager_redist
    fetched = redist.fetch(config, layout, listed, bases, sha256=config.nvlsm_sha256)
    log.info("NVLSM %s: %s (sha256 %s, verified by %s)", listed.version, listed.name,
             fetched.sha256, fetched.verified_by)
    return listed, Path(fetched.path)


def unpack_and_install(archive: Path, work: Path, layout: Layout, driver: str,
                       version: str) -> list[str]:
    """Extract `archive` confined to its top directory and place its files (`place`); the
    marker names the archive's SHA-256. Raises ArchiveUnsafe or NvlsmMismatch (no daemon or no
    config)."""
    from installer.delivery import extract, file_sha256

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
