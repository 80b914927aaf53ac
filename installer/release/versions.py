"""Version requests, their resolution to a version, branch and module flavour for these GPUs
(the GPU-aware choice itself: installer.release.choice), and the runfile's download URL."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, NamedTuple, Union

from installer.errors import (
    ConfigError,
    InvalidVersion,
)
from installer.host import Flavour, PciGpu
from installer.release import choice
from installer.release.catalog import (
    Catalog,
    is_version,
    version_major,
)
from installer.release.floors import Floor, FloorGate
from installer.release.gpus import OPEN, PROPRIETARY, GpuDatabase, shipped_database

ALIASES = ("auto", "latest", "production", "lts")
# COS's installer calls the GPU-aware choice "default"; accepted so its settings keep working.
_ALIAS_SYNONYMS = {"default": "auto"}
_BRANCH_RE = r"(?a)^[rR]?([1-9]\d{2})$"

DEFAULT_BASE = "https://us.download.nvidia.com"
DEFAULT_BRANCH_PATH = "tesla"
ARCHES = ("x86_64", "aarch64")
_PATH_ELEMENT = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

RequestKind = Literal["exact", "branch", "alias"]


class VersionRequest(NamedTuple):
    """A validated request: an exact version, a branch major ("550") or an alias."""

    kind: RequestKind
    value: str
    raw: str


class Resolution(NamedTuple):
    """The chosen driver and why (`reasons` are printed by `installer plan`)."""

    version: str
    branch: int
    branch_type: str | None
    flavour: Flavour
    reasons: tuple[str, ...]
    in_catalog: bool = True


def parse_request(text: str) -> VersionRequest:
    """Validate a version request; raises InvalidVersion naming the value.

    Accepted: 550.54.15 or 470.82 (digits and dots only), 550 / R550 / r550, and the
    aliases auto (also `default`), latest, production, lts.
    """
    value = text.strip() if isinstance(text, str) else ""
    lowered = value.lower()
    if lowered in ALIASES:
        return VersionRequest("alias", lowered, text)
    if lowered in _ALIAS_SYNONYMS:
        return VersionRequest("alias", _ALIAS_SYNONYMS[lowered], text)
    if is_version(value):
        return VersionRequest("exact", value, text)
    branch = re.fullmatch(_BRANCH_RE, value)
    if branch is not None:
        return VersionRequest("branch", branch.group(1), text)
    raise InvalidVersion(f"invalid driver version {text!r}")


def resolve(
    request: Union[str, VersionRequest],
    catalog: Catalog,
    gpus: Sequence[PciGpu],
    *,
    module_type: str = "auto",
    track: str = "lts",
    database: GpuDatabase | None = None,
    floors: Sequence[Floor] = (),
    allow_below_floor: bool = False,
) -> Resolution:
    """Choose version, branch and kernel module flavour for these GPUs. Pure: reads nothing.

    `floors` are the host's (release.floors.applicable): `auto` picks the newest release that
    meets them all; an explicit request below one raises DriverBelowFloor unless
    `allow_below_floor`. Raises InvalidVersion, UnknownVersion (a branch the catalog lacks),
    UnsupportedGpu (the choice cannot drive a GPU, or a forced flavour it does not support),
    IncompatibleGpus (no single driver serves all GPUs), NoReleaseMeetsFloors, ConfigError
    (bad module_type/track values).
    """
    req = parse_request(request) if isinstance(request, str) else request
    if module_type not in ("auto", OPEN, PROPRIETARY):
        raise ConfigError(f"invalid kernel module type {module_type!r} (auto, open, proprietary)")
    if track not in ("lts", "production"):
        raise ConfigError(f"invalid track {track!r} (lts, production)")
    db = database if database is not None else shipped_database()
    found = [db.describe(pci) for pci in gpus]
    reasons = choice.gpu_reasons(found)
    choice.check_flavours_compatible(found)
    gate = FloorGate(tuple(floors),
                     lambda major: choice.flavour_options(found, major, module_type),
                     lambda major: all(g.model.supports_branch(major) for g in found),
                     allow_below_floor)

    in_catalog = True
    if req.kind == "exact":
        version = req.value
        major = version_major(version)
        hit = catalog.find(version)
        branch = catalog.branch(major)
        if hit is not None:
            reasons.append(f"version {version} pinned ({choice.describe(hit[0])}, "
                           f"{choice.released(hit[1])})")
        else:
            in_catalog = False
            reasons.append(
                f"version {version} pinned; it is not in the catalog ({catalog.source}), so it "
                "may be newer than the catalog: used as given"
            )
        gate.require(version, f"version {version}", catalog, reasons)
        choice.check_support(found, major, f"version {version}")
        branch_type = branch.type if branch is not None else None
    else:
        chosen = choice.choose_branch(req.kind, req.value, req.raw, catalog, found, track, reasons,
                                      gate)
        major, branch_type = chosen.major, chosen.type
        release = gate.release_in(chosen)
        if release is None:
            # Only an explicit branch or alias gets here: auto skips such branches.
            release = chosen.newest  # below a floor, allowed (require_branch said so)
        version = release.version
        if release is chosen.newest:
            reasons.append(f"version {version}: the newest release of R{major} in the catalog")
        else:
            reasons.append(
                f"version {version}: the newest release of R{major} in the catalog that meets "
                f"the floors ({chosen.newest.version} does not: "
                f"{choice.floor_ids(gate.blocking(chosen.newest.version))})"
            )
    flavour = choice.choose_flavour(found, major, version, module_type, reasons, gate)
    return Resolution(version, major, branch_type, flavour, tuple(reasons), in_catalog)


def runfile_url(
    version: str,
    arch: str,
    branch_path: str = DEFAULT_BRANCH_PATH,
    base: str = DEFAULT_BASE,
    *,
    catalog: Catalog | None = None,
) -> str:
    """The .run URL: the catalog's own URL when it lists `version` (default location only),
    else `<base>/<branch_path>/<v>/NVIDIA-Linux-<arch>-<v>.run`. Raises InvalidVersion or
    ConfigError for values that must not reach a URL.
    """
    if not is_version(version):
        raise InvalidVersion(f"invalid driver version {version!r}")
    if arch not in ARCHES:
        raise ConfigError(f"unsupported architecture {arch!r} for a driver download")
    if not all(re.fullmatch(_PATH_ELEMENT, part) for part in branch_path.split("/")):
        raise ConfigError(f"invalid download branch path {branch_path!r}")
    if not base.startswith(("http://", "https://", "file://")):
        raise ConfigError(f"invalid download base URL {base!r}")
    if catalog is not None and base == DEFAULT_BASE and branch_path == DEFAULT_BRANCH_PATH:
        hit = catalog.find(version)
        listed = hit[1].runfile_url(arch) if hit is not None else None
        if listed:
            return listed
    return f"{base.rstrip('/')}/{branch_path}/{version}/NVIDIA-Linux-{arch}-{version}.run"
