"""The driver version catalog, in the shape of NVIDIA's releases.json."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Callable, NamedTuple

from installer.errors import CatalogUnavailable

LTS = "lts branch"
PRODUCTION = "production branch"
NEW_FEATURE = "new feature branch"

SHIPPED = "installer/release/data/releases.json"

# Digits and dots only, 2 or 3 components, a 3-digit major: the value ends up in URLs,
# file names and argv, so nothing looser is accepted anywhere.
# (?a), re.ASCII: \d would otherwise accept any Unicode digit (Arabic-Indic, fullwidth, ...).
VERSION_RE = r"(?a)^(?P<major>[1-9]\d{2})\.(?P<minor>\d{1,3})(?:\.(?P<patch>\d{1,3}))?$"

_URL_SCHEMES = ("http://", "https://", "file://")

Fetch = Callable[[str], bytes]


def is_version(text: str) -> bool:
    return re.fullmatch(VERSION_RE, text) is not None


def version_key(version: str) -> tuple[int, ...]:
    """Numeric sort key: 550.127.05 sorts after 550.54.15."""
    return tuple(int(part) for part in version.split("."))


def version_major(version: str) -> int:
    return int(version.split(".", 1)[0])


class Release(NamedTuple):
    """One driver release of a branch."""

    version: str
    date: str = ""
    notes_url: str = ""
    architectures: tuple[str, ...] = ()
    runfile_urls: tuple[tuple[str, str], ...] = ()

    def runfile_url(self, arch: str) -> str | None:
        for name, url in self.runfile_urls:
            if name == arch:
                return url
        return None


class Branch(NamedTuple):
    """A driver branch (R535, R580, ...) and its releases, newest first."""

    major: int
    type: str
    releases: tuple[Release, ...]

    @property
    def newest(self) -> Release:
        return self.releases[0]

    @property
    def is_lts(self) -> bool:
        return self.type == LTS

    @property
    def is_production(self) -> bool:
        """NVIDIA: every LTS branch is a production branch."""
        return self.type in (PRODUCTION, LTS)

    @property
    def label(self) -> str:
        return f"R{self.major} ({self.type})"


class Catalog(NamedTuple):
    """Branches newest first; `source` names where the catalog came from."""

    branches: tuple[Branch, ...]
    source: str

    def branch(self, major: int) -> Branch | None:
        for branch in self.branches:
            if branch.major == major:
                return branch
        return None

    def find(self, version: str) -> tuple[Branch, Release] | None:
        branch = self.branch(version_major(version)) if is_version(version) else None
        if branch is not None:
            for release in branch.releases:
                if release.version == version:
                    return branch, release
        return None

    def of_types(self, *types: str) -> tuple[Branch, ...]:
        return tuple(b for b in self.branches if b.type in types)

    def newest_release(self) -> tuple[Branch, Release]:
        branch = max(self.branches, key=lambda b: version_key(b.newest.version))
        return branch, branch.newest


def load(source: str | None, fetch: Fetch) -> Catalog:
    """The catalog from `source`: None = shipped, a local path, or an http(s)/file URL.

    URLs are read through the injected `fetch` (the download module). Reads the file or
    the network; raises CatalogUnavailable naming the source and what was wrong.
    """
    if source is None or source == "":
        return shipped()
    if "://" in source:
        shown = redact(source)
        if not source.startswith(_URL_SCHEMES):
            raise CatalogUnavailable(
                f"catalog {shown}: unsupported URL scheme (use http://, https://, file:// "
                "or a local path)"
            )
        try:
            data = fetch(source)
        except Exception as exc:  # any failure of the injected fetcher means "unavailable"
            detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            raise CatalogUnavailable(f"catalog {shown} could not be fetched: {detail}") from exc
        # Whoever serves a remote catalog must not make this node run one of its own files.
        remote = not source.startswith("file://")
        return parse(data, shown, remote=remote)
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise CatalogUnavailable(
            f"catalog {source} could not be read: {exc.strerror or exc}"
        ) from exc
    return parse(data, source)


@functools.lru_cache(maxsize=1)
def shipped() -> Catalog:
    """The catalog shipped with the package (parsed once per process)."""
    # Beside this module, as gpus.shipped_database reads gpus.json (not importlib.resources:
    # it costs the warm path its zipfile readers).
    data = (Path(__file__).parent / "data" / "releases.json").read_bytes()
    return parse(data, SHIPPED)


def redact(url: str) -> str:
    """`url` without user:password or secret query values (never logged or shown)."""
    from installer.delivery import redact_url

    return redact_url(url)


def parse(data: bytes | str, source: str, *, remote: bool = False) -> Catalog:
    """A Catalog from releases.json content; raises CatalogUnavailable when malformed.

    A `remote` catalog (fetched over http(s)) may name http(s) runfile URLs only."""
    try:
        document = json.loads(data)
    except RecursionError as exc:
        raise CatalogUnavailable(f"catalog {source} is nested too deeply to be a releases.json"
                                 ) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise CatalogUnavailable(f"catalog {source} is not valid JSON: {exc}") from exc
    try:
        branches = _branches(document, remote)
    except _Malformed as exc:
        raise CatalogUnavailable(f"catalog {source} is malformed: {exc}") from exc
    if not branches:
        raise CatalogUnavailable(f"catalog {source} lists no driver branches")
    return Catalog(branches=branches, source=source)


class _Malformed(Exception):
    pass


def _check_runfile_url(where: str, url: str, remote: bool) -> None:
    from installer.delivery import control_character

    bad = control_character(url)
    if bad is not None:
        raise _Malformed(f"{where} holds a control character ({bad})")
    if remote and url.lower().startswith("file:"):
        raise _Malformed(
            f"{where} is {redact(url)!r}: a catalog fetched over the network may name "
            "http:// and https:// URLs only (file:// is for the operator's own settings)"
        )


def _branches(document: Any, remote: bool = False) -> tuple[Branch, ...]:
    if not isinstance(document, dict):
        raise _Malformed("the top level must be an object keyed by branch")
    branches: list[Branch] = []
    for key, value in document.items():
        if not (isinstance(key, str) and re.fullmatch(r"[1-9]\d{2}", key)):
            raise _Malformed(f"branch key {key!r} is not a 3-digit branch number")
        if not isinstance(value, dict):
            raise _Malformed(f"branch {key}: must be an object")
        kind = value.get("type")
        if not isinstance(kind, str) or not kind:
            raise _Malformed(f"branch {key}: missing 'type'")
        infos = value.get("driver_info")
        if not isinstance(infos, list) or not infos:
            raise _Malformed(f"branch {key}: 'driver_info' must be a non-empty list")
        releases = [_release(key, index, info, remote) for index, info in enumerate(infos)]
        # The file lists newest first; sorting guards against a hand-edited mirror.
        releases.sort(key=lambda r: version_key(r.version), reverse=True)
        branches.append(Branch(major=int(key), type=kind.lower(), releases=tuple(releases)))
    branches.sort(key=lambda b: b.major, reverse=True)
    return tuple(branches)


def _release(branch: str, index: int, info: Any, remote: bool = False) -> Release:
    where = f"branch {branch}, driver_info[{index}]"
    if not isinstance(info, dict):
        raise _Malformed(f"{where}: must be an object")
    version = info.get("release_version")
    if not isinstance(version, str) or not is_version(version):
        raise _Malformed(f"{where}: release_version {version!r} is not a driver version")
    if version_major(version) != int(branch):
        raise _Malformed(f"{where}: release {version} does not belong to branch {branch}")
    urls = info.get("runfile_url", {})
    if not isinstance(urls, dict):
        raise _Malformed(f"{where}: runfile_url must be an object keyed by architecture")
    for arch, url in urls.items():
        if isinstance(url, str):
            _check_runfile_url(f"{where}: runfile_url[{arch!r}]", url, remote)
    runfiles = tuple(
        (str(arch), url)
        for arch, url in sorted(urls.items())
        if isinstance(url, str) and url.startswith(_URL_SCHEMES)
    )
    arches = info.get("architectures", [])
    architectures = (
        tuple(a for a in arches if isinstance(a, str)) if isinstance(arches, list) else ()
    )
    return Release(
        version=version,
        date=str(info.get("release_date", "")),
        notes_url=str(info.get("release_notes", "")),
        architectures=architectures,
        runfile_urls=runfiles,
    )
