"""Fabric Manager from NVIDIA's driver redist tree: its entry in the redistrib JSON and its
archive (through installer/components/redist: mirrors, the trust rules, the cache), and its
files in versions/<ver>/."""

from __future__ import annotations

import logging
import re
from pathlib import Path, PurePosixPath

from installer import safefs
from installer.components import redist
from installer.config import Config
from installer.dirs import mark_complete
from installer.errors import (
    FabricManagerMismatch,
    FabricManagerUnavailable,
    InstallerError,
)
from installer.layout import Layout
from installer.runner import Runner

log = logging.getLogger(__name__)

COMPONENT_KEY = "fabricmanager"
INSTALLED_MARKER = ".fabricmanager-version"
_ARCHIVE_DIGEST = ".archive-sha256"
_SHA256 = r"^[0-9a-f]{64}$"
_FM_VERSION = r"Fabric Manager version is\s*:\s*(\S+)"


def archive_name(version: str, arch: str) -> str:
    return redist.archive_name(COMPONENT_KEY, version, arch)


def config_dir(layout: Layout, version: str) -> Path:
    """Where the archive's fabricmanager.cfg and topology files go (its share/ layout)."""
    return layout.version_dir(version) / "share" / "nvidia" / "nvswitch"


def binary(layout: Layout, version: str) -> Path:
    return layout.version_dir(version) / "bin" / "nv-fabricmanager"


def installed(layout: Layout, version: str) -> bool:
    """Fabric Manager `version` is in place: its marker names the version and the SHA-256 of
    what it came from. A marker of the version alone is an older installer's, which took an
    archive on a mirror's own JSON: that install is done anew."""
    marker = config_dir(layout, version) / INSTALLED_MARKER
    try:
        text = marker.read_text()
    except OSError:
        return False
    return (re.fullmatch(re.escape(version) + r"\n[0-9a-f]{64}\n", text) is not None
            and binary(layout, version).is_file())




def record_archive_digest(archive: Path, tree: Path) -> None:
    """The archive's SHA-256 beside its unpacked tree, for install() to put in the marker (a
    top-level dot-file: install() moves only bin/, lib/, etc/ and share/)."""
    from installer.delivery import file_sha256

    (tree / _ARCHIVE_DIGEST).write_text(file_sha256(archive) + "\n")


def _source_digest(tree: Path) -> str:
    """What the install came from: the archive's digest unpack() recorded, else (a tree the
    host's own packages made, which its package manager vouched for) the daemon's own."""
    from installer.delivery import file_sha256

    try:
        recorded = (tree / _ARCHIVE_DIGEST).read_text().strip()
    except OSError:
        return file_sha256(tree / "bin" / "nv-fabricmanager")
    if re.fullmatch(_SHA256, recorded) is None:
        raise FabricManagerMismatch(f"{tree}: a malformed archive digest {recorded!r}")
    return recorded


def parse_manifest(data: bytes, version: str, arch: str, where: str) -> redist.Listed:
    """The fabricmanager entry for `arch` of NVIDIA's redistrib JSON, checked: it names this
    version and an archive of the expected name under the tree. Raises FabricManagerUnavailable
    (no entry) or FabricManagerMismatch (an entry that is not this version's archive)."""

    def archive(listed: str, path: PurePosixPath) -> str | None:
        name = archive_name(listed, arch)
        return None if path.name == name else f"{name} in the tree"

    return redist.parse(data, COMPONENT_KEY, arch, where, absent=FabricManagerUnavailable,
                        mismatch=FabricManagerMismatch, archive=archive, version=version)


def digest_source(config: Config, version: str, arch: str) -> str:
    """Where the archive's SHA-256 will come from, for `installer plan`."""
    from installer.release import download

    return download.digest_source(
        config, archive_name(version, arch),
        [redist.manifest_url(base, version) for base in config.fabricmanager_redist],
        pinned=False)


def locate(config: Config, version: str, arch: str, *,
           need_trusted: bool = False) -> tuple[redist.Listed, list[str]]:
    """The listing from the first base of NVIDIA_FABRICMANAGER_REDIST that has one (with
    `need_trusted`, the first on a trusted origin when any base is one), and the archive's URL
    under every base (mirrors hold NVIDIA's layout). Raises FabricManagerUnavailable when no
    base lists it, or the download errors of a base that fails otherwise."""
    found = redist.lookup(config, version,
                          lambda data, where: parse_manifest(data, version, arch, where),
                          need_trusted=need_trusted)
    if found.listed is None:
        raise FabricManagerUnavailable(
            f"no redistrib_{version}.json in the redist tree: tried {found.tried}")
    return found.listed, redist.urls(config.fabricmanager_redist, found.listed.relative_path)


def fetch(config: Config, layout: Layout, version: str, arch: str) -> Path:
    """The archive in the download cache, verified as installer.components.redist verifies
    (the digests file, or a redistrib JSON fetched over TLS from a trusted origin; a mirror's
    JSON only says where the archive lies). Raises UnverifiedDownload when nothing vouches
    (before any archive byte is fetched)."""
    from installer.delivery import digests

    local = digests.listed_in(config.digests_file, archive_name(version, arch))
    listed, _ = locate(config, version, arch, need_trusted=local is None)
    fetched = redist.fetch(config, layout, listed, config.fabricmanager_redist)
    log.info("Fabric Manager %s: %s (sha256 %s, verified by %s)", version, fetched.path.name,
             fetched.sha256, fetched.verified_by)
    return Path(fetched.path)


def cached(config: Config, layout: Layout, version: str, arch: str) -> Path | None:
    """A cached archive that fetch would use: the digests file lists it, or it or a trusted
    origin vouched for it when it was fetched (read-only, no network). A record saying "pin"
    is an older installer's, which took a mirror's JSON for a pin: not used."""
    from installer import delivery

    found = delivery.find_vouched(layout.downloads, archive_name(version, arch), None,
                                  redist.download_settings(config))
    return Path(found.path) if found is not None and found.verified_by != "pin" else None


def drop_cached(layout: Layout, version: str, arch: str) -> None:
    name = archive_name(version, arch)
    for path in layout.downloads.glob(name + "*") if layout.downloads.is_dir() else []:
        path.unlink()
    log.info("dropped %s from the cache", name)


def unpack(archive: Path, dest: Path) -> Path:
    """Extract `archive` into `dest`: every member inside its one top directory by resolved real
    paths (installer.delivery.unpack), and that directory holds bin/nv-fabricmanager. Returns
    the top directory. Raises ArchiveUnsafe (a member that would escape) or
    FabricManagerMismatch (no daemon)."""
    from installer.delivery import extract

    tree = extract(archive, dest, archive.name[: -len(".tar.xz")])
    if not (tree / "bin" / "nv-fabricmanager").is_file():
        raise FabricManagerMismatch(f"{archive.name} has no bin/nv-fabricmanager")
    record_archive_digest(archive, tree)
    return tree


def reported_version(runner: Runner, nv_fabricmanager: Path) -> str | None:
    """What `nv-fabricmanager --version` prints: `Fabric Manager version is : <v>`."""
    result = runner.run([str(nv_fabricmanager), "--version"], check=False, timeout=60)
    found = re.search(_FM_VERSION, result.output)
    return found.group(1) if found else None


def install(tree: Path, final_root: Path, config_dest: Path, version: str, *,
            within: Path | None = None) -> list[str]:
    """The unpacked archive's daemon, tools, library, config and topology files into the
    version dir `final_root` (<install dir>/versions/<ver>: bin/, lib64/,
    share/nvidia/nvswitch/), each by rename, never through a link below `within` (default:
    the install dir above `final_root`); the marker last. Returns the installed names."""
    anchor = within if within is not None else final_root.parent.parent
    came_from = _source_digest(tree)
    placed = []
    moves: list[tuple[Path, Path]] = []
    for item in sorted((tree / "bin").iterdir()):
        if item.is_file() and not item.name.endswith(".sh"):
            moves.append((item, final_root / "bin" / item.name))
    for item in sorted((tree / "lib").glob("*.so*")) if (tree / "lib").is_dir() else []:
        moves.append((item, final_root / "lib64" / item.name))
    if (tree / "etc" / "fabricmanager.cfg").is_file():
        moves.append((tree / "etc" / "fabricmanager.cfg", config_dest / "fabricmanager.cfg"))
    shared = tree / "share" / "nvidia" / "nvswitch"
    for item in sorted(shared.iterdir()) if shared.is_dir() else []:
        if item.is_file():
            moves.append((item, config_dest / item.name))
    if not any(dest.name == "fabricmanager.cfg" for _, dest in moves):
        raise FabricManagerMismatch(f"the {version} archive has no fabricmanager.cfg")
    for source, dest in moves:
        safefs.place_copy(source, dest, anchor=anchor)
        placed.append(str(dest.relative_to(final_root)))
    # The marker names what the files came from: a later run trusts only installs this
    # installer made from an archive its rules vouched for (an older one's marker lacks it).
    mark_complete(config_dest, f"{version}\n{came_from}\n", INSTALLED_MARKER)
    return placed


def fail_mismatch(layout: Layout, version: str, arch: str, message: str) -> InstallerError:
    drop_cached(layout, version, arch)
    return FabricManagerMismatch(message)
