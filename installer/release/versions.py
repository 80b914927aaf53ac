"""Version requests and GPU-aware choice of driver version, branch and module flavour."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, NamedTuple, Union

from installer.errors import (
    ConfigError,
    IncompatibleGpus,
    InvalidVersion,
    NoReleaseMeetsFloors,
    UnknownVersion,
    UnsupportedGpu,
)
from installer.host import Flavour, PciGpu
from installer.release.catalog import (
    LTS,
    PRODUCTION,
    Branch,
    Catalog,
    Release,
    is_version,
    version_major,
)
from installer.release.floors import Floor, FloorGate, violated
from installer.release.gpus import OPEN, PROPRIETARY, Gpu, GpuDatabase, GpuModel, shipped_database

ALIASES = ("auto", "latest", "production", "lts")
# COS's installer calls the GPU-aware choice "default"; accepted so its settings keep working.
_ALIAS_SYNONYMS = {"default": "auto"}
_BRANCH_RE = r"(?a)^[rR]?([1-9]\d{2})$"

# Open kernel modules were first published with R515; NVIDIA made them the default in R560.
FIRST_OPEN_BRANCH = 515
OPEN_DEFAULT_BRANCH = 560

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
    reasons = _gpu_reasons(found)
    _check_flavours_compatible(found)
    gate = FloorGate(tuple(floors), lambda major: _flavour_options(found, major, module_type),
                     lambda major: all(g.model.supports_branch(major) for g in found),
                     allow_below_floor)

    in_catalog = True
    if req.kind == "exact":
        version = req.value
        major = version_major(version)
        hit = catalog.find(version)
        branch = catalog.branch(major)
        if hit is not None:
            reasons.append(f"version {version} pinned ({_describe(hit[0])}, {_released(hit[1])})")
        else:
            in_catalog = False
            reasons.append(
                f"version {version} pinned; it is not in the catalog ({catalog.source}), so it "
                "may be newer than the catalog: used as given"
            )
        gate.require(version, f"version {version}", catalog, reasons)
        _check_support(found, major, f"version {version}")
        branch_type = branch.type if branch is not None else None
    else:
        chosen = _choose_branch(req, catalog, found, track, reasons, gate)
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
                f"{_floor_ids(gate.blocking(chosen.newest.version))})"
            )
    flavour = _choose_flavour(found, major, version, module_type, reasons, gate)
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


# --- branch choice -----------------------------------------------------------------------


def _choose_branch(
    req: VersionRequest, catalog: Catalog, found: list[Gpu], track: str, reasons: list[str],
    gate: FloorGate,
) -> Branch:
    if req.kind == "branch":
        branch = catalog.branch(int(req.value))
        if branch is None:
            known = ", ".join(f"R{b.major}" for b in catalog.branches)
            raise UnknownVersion(
                f"branch R{req.value} is not in the catalog ({catalog.source}); it lists {known}"
            )
        reasons.append(f"branch R{branch.major} requested ({_describe(branch)})")
        gate.require_branch(branch, f"{req.raw.strip()!r} (R{branch.major})", catalog, reasons)
        _check_support(found, branch.major, f"branch R{branch.major}")
        return branch
    if req.value == "latest":
        branch, _ = catalog.newest_release()
        reasons.append(f"'latest': the newest release in the catalog is in {_describe(branch)}")
        gate.require_branch(branch, f"{req.raw.strip()!r} (R{branch.major})", catalog, reasons)
        _check_support(found, branch.major, f"'latest' (R{branch.major})")
        return branch
    if req.value in ("production", "lts"):
        types = (LTS,) if req.value == "lts" else (PRODUCTION, LTS)
        candidates = catalog.of_types(*types)
        if not candidates:
            raise UnknownVersion(f"the catalog ({catalog.source}) lists no {req.value} branch")
        branch = candidates[0]
        reasons.append(
            f"'{req.value}': the newest {_track_words(req.value)} is {_describe(branch)}"
        )
        gate.require_branch(branch, f"{req.raw.strip()!r} (R{branch.major})", catalog, reasons)
        _check_support(found, branch.major, f"'{req.value}' (R{branch.major})")
        return branch
    return _auto_branch(catalog, found, track, reasons, gate)


def _auto_branch(catalog: Catalog, found: list[Gpu], track: str, reasons: list[str],
                 gate: FloorGate) -> Branch:
    legacy = [g for g in found if g.model.legacy_branch and g.model.last_branch is not None]
    if legacy:
        branch = _legacy_branch(catalog, found, legacy, reasons)
        if gate.release_in(branch) is None:
            raise NoReleaseMeetsFloors(
                f"{_describe(branch)}, the only branch for {_labels(legacy)}, has no release "
                f"in the catalog that meets this host's floor: "
                + "; ".join(f.describe() for f in gate.blocking(branch.newest.version)))
        return branch
    types = (LTS,) if track == "lts" else (PRODUCTION, LTS)
    words = _track_words(track)
    in_track = catalog.of_types(*types)
    floored: list[Floor] = []
    for branch in in_track:
        blockers = [g for g in found if not g.model.supports_branch(branch.major)]
        if not blockers and gate.release_in(branch) is None:
            stopped = gate.blocking(branch.newest.version)
            floored += [f for f in stopped if f not in floored]
            reasons.append(f"auto: skipped {_describe(branch)}: no release of it meets the "
                           f"floor {_floor_ids(stopped)}")
            continue
        if not blockers:
            if found:
                reasons.append(
                    f"auto (track {track}): {_describe(branch)} is the newest {words} "
                    "supporting every GPU found" + (" and meeting the floors" if floored else "")
                )
            else:
                reasons.append(f"auto (track {track}): {_describe(branch)} is the newest {words}"
                               + (" meeting the floors" if floored else ""))
            return branch
        reasons.append(
            f"auto: skipped {_describe(branch)}: it does not support {_labels(blockers)}"
        )
    # Past the track: production branches (NVIDIA's own defaults, as R595 where no LTS
    # branch builds) before new-feature ones, which get no fixes after their release.
    for branch in catalog.of_types(PRODUCTION, LTS) + catalog.branches:
        if all(g.model.supports_branch(branch.major) for g in found) and (
                gate.release_in(branch) is not None):
            what = "meets the floors and supports every GPU found" if floored else (
                "supports every GPU found")
            reasons.append(
                f"auto: no {words} in the catalog {what}; using the newest "
                f"{'production ' if branch.is_production else ''}branch that does: "
                f"{_describe(branch)}"
            )
            return branch
    if floored:
        raise NoReleaseMeetsFloors(
            f"no release in the catalog ({catalog.source}) that drives the GPUs found meets "
            "this host's floors: " + "; ".join(f.describe() for f in floored))
    # No branch at all: either one GPU has no branch in the catalog, or no branch serves all.
    orphans = [
        g for g in found if not any(g.model.supports_branch(b.major) for b in catalog.branches)
    ]
    if orphans:
        raise UnsupportedGpu(
            f"no branch in the catalog ({catalog.source}) can drive these GPUs: {_ranges(orphans)}"
        )
    raise IncompatibleGpus(f"no single driver branch supports all of these GPUs: {_ranges(found)}")


def _legacy_branch(
    catalog: Catalog, found: list[Gpu], legacy: list[Gpu], reasons: list[str]
) -> Branch:
    majors = sorted({g.model.last_branch for g in legacy if g.model.last_branch is not None})
    major = majors[-1]
    others = [g for g in found if not g.model.supports_branch(major)]
    if len(majors) > 1 or others:
        raise IncompatibleGpus(
            f"one driver cannot serve these GPUs together: {_ranges(legacy)}; {_ranges(others)}"
        )
    branch = catalog.branch(major)
    if branch is None:
        raise UnknownVersion(
            f"the catalog ({catalog.source}) does not list the {major} legacy branch, the only "
            f"one for these GPUs: {_labels(legacy)}"
        )
    reasons.append(
        f"auto: using {_describe(branch)} whatever the track: it is the legacy branch, the "
        f"only one for {_labels(legacy)}"
    )
    return branch


def _check_support(found: list[Gpu], major: int, what: str) -> None:
    blockers = [g for g in found if not g.model.supports_branch(major)]
    if blockers:
        raise UnsupportedGpu(f"{what} cannot drive these GPUs: {_ranges(blockers)}")


# --- flavour choice ----------------------------------------------------------------------


def _flavour_options(found: list[Gpu], major: int, module_type: str) -> list[str]:
    """The flavours a release of `major` could still be built in for these GPUs."""
    if module_type in (OPEN, PROPRIETARY):
        return [module_type]
    allowed = {OPEN, PROPRIETARY}
    for gpu in found:
        allowed &= gpu.model.flavours
    if major < FIRST_OPEN_BRANCH:
        allowed.discard(OPEN)
    return sorted(allowed) or [OPEN, PROPRIETARY]


def _check_flavours_compatible(found: list[Gpu]) -> None:
    only_open = [g for g in found if g.model.flavours == {OPEN}]
    only_proprietary = [g for g in found if g.model.flavours == {PROPRIETARY}]
    if only_open and only_proprietary:
        raise IncompatibleGpus(
            "one driver cannot serve these GPUs together: open kernel modules only: "
            f"{_labels(only_open)}; proprietary kernel modules only: {_labels(only_proprietary)}"
        )


def _choose_flavour(
    found: list[Gpu], major: int, version: str, module_type: str, reasons: list[str],
    gate: FloorGate | None = None,
) -> Flavour:
    allowed: set[Flavour] = {OPEN, PROPRIETARY}
    for gpu in found:
        allowed &= gpu.model.flavours
    has_open = major >= FIRST_OPEN_BRANCH
    if not has_open:
        needs_open = [g for g in found if g.model.flavours == {OPEN}]
        if needs_open:
            raise UnsupportedGpu(
                f"{version} (R{major}) has no open kernel modules (they exist from "
                f"R{FIRST_OPEN_BRANCH} on), and these GPUs need them: {_labels(needs_open)}"
            )
        allowed.discard(OPEN)
    if module_type in (OPEN, PROPRIETARY):
        if module_type not in allowed:
            blockers = [g for g in found if module_type not in g.model.flavours]
            if blockers:
                other = PROPRIETARY if module_type == OPEN else OPEN
                raise UnsupportedGpu(
                    f"{module_type} kernel modules were requested, but these GPUs support "
                    f"only the {other} ones: {_labels(blockers)}"
                )
            raise ConfigError(
                f"open kernel modules were requested, but they exist from "
                f"R{FIRST_OPEN_BRANCH} on; {version} (R{major}) has only proprietary ones"
            )
        flavour: Flavour = OPEN if module_type == OPEN else PROPRIETARY
        reasons.append(f"kernel modules: {flavour}, as requested")
        return flavour
    default: Flavour = OPEN if major >= OPEN_DEFAULT_BRANCH else PROPRIETARY
    rule = (
        f"NVIDIA's default from R{OPEN_DEFAULT_BRANCH} on"
        if default == OPEN
        else f"NVIDIA's default before R{OPEN_DEFAULT_BRANCH}"
        if has_open
        else f"R{major} predates the open modules"
    )
    floors = gate.floors if gate is not None else ()
    stopped = violated(floors, version, default)
    spare: Flavour = PROPRIETARY if default == OPEN else OPEN
    if stopped and spare in allowed and not violated(floors, version, spare):
        reasons.append(f"kernel modules: {spare}: the floor {_floor_ids(stopped)} stops the "
                       f"{default} ones ({rule})")
        return spare
    if default in allowed:
        reasons.append(f"kernel modules: {default} ({rule})")
        return default
    chosen: Flavour = PROPRIETARY if default == OPEN else OPEN
    limiting = [g for g in found if default not in g.model.flavours]
    reasons.append(
        f"kernel modules: {chosen}, the only type these GPUs support: {_labels(limiting)}"
    )
    return chosen


# --- words -------------------------------------------------------------------------------


def _gpu_reasons(found: list[Gpu]) -> list[str]:
    if not found:
        return ["no NVIDIA GPU was found on the host: choosing without GPU constraints"]
    counts: dict[str, int] = {}
    for gpu in found:
        key = f"{gpu.model.name} ({gpu.pci.pci_id})"
        counts[key] = counts.get(key, 0) + 1
    listed = ", ".join(f"{n} x {name}" for name, n in counts.items())
    reasons = [f"found {len(found)} NVIDIA GPU(s): {listed}"]
    for label, model in _groups([g for g in found if not g.model.known]):
        treated = (
            "newer than it (open kernel modules only)"
            if OPEN in model.flavours
            else "an older pre-Turing GPU (proprietary modules, R580 or older)"
        )
        reasons.append(f"{label} is not in the shipped GPU list: treated as {treated}")
    return reasons


def _groups(gpus: Sequence[Gpu]) -> list[tuple[str, GpuModel]]:
    """GPUs grouped by model: ('Tesla K80 (10de:102d) at 0000:00:04.0, 0000:00:05.0', model)."""
    groups: dict[int, tuple[GpuModel, list[str]]] = {}
    for gpu in gpus:
        groups.setdefault(gpu.model.device_id, (gpu.model, []))[1].append(gpu.pci.address)
    return [
        (f"{model.name} (10de:{model.device_id:04x}) at {', '.join(addresses)}", model)
        for model, addresses in groups.values()
    ]


def _labels(gpus: Sequence[Gpu]) -> str:
    return "; ".join(label for label, _ in _groups(gpus))


def _ranges(gpus: Sequence[Gpu]) -> str:
    return "; ".join(f"{label}: supported by {m.branch_range()}" for label, m in _groups(gpus))


def _floor_ids(floors: Sequence[Floor]) -> str:
    return ", ".join(f"{f.id} ({f.asks()})" for f in floors)


def _describe(branch: Branch) -> str:
    return f"R{branch.major} ({branch.type})"


def _released(release: Release) -> str:
    return f"released {release.date}" if release.date else "release date unknown"


def _track_words(track: str) -> str:
    return "LTS branch" if track == "lts" else "production or LTS branch"
