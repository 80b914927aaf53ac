"""The GPU-aware choice behind a version request: which branch (a named one, an alias, the
legacy branch some GPUs need, or auto along a track) and which kernel module flavour, each with
the reasons the plan prints. Pure: reads nothing."""

from __future__ import annotations

from collections.abc import Sequence

from installer.errors import (
    ConfigError,
    IncompatibleGpus,
    NoReleaseMeetsFloors,
    UnknownVersion,
    UnsupportedGpu,
)
from installer.host import Flavour
from installer.release.catalog import LTS, PRODUCTION, Branch, Catalog, Release
from installer.release.floors import Floor, FloorGate, violated
from installer.release.gpus import OPEN, PROPRIETARY, Gpu, GpuModel

# Open kernel modules were first published with R515; NVIDIA made them the default in R560.
FIRST_OPEN_BRANCH = 515
OPEN_DEFAULT_BRANCH = 560


# --- branch choice -----------------------------------------------------------------------


def choose_branch(
    kind: str, value: str, raw: str, catalog: Catalog, found: list[Gpu], track: str,
    reasons: list[str], gate: FloorGate,
) -> Branch:
    """The branch for a branch or alias request (`raw`: as the operator wrote it)."""
    if kind == "branch":
        branch = catalog.branch(int(value))
        if branch is None:
            known = ", ".join(f"R{b.major}" for b in catalog.branches)
            raise UnknownVersion(
                f"branch R{value} is not in the catalog ({catalog.source}); it lists {known}"
            )
        reasons.append(f"branch R{branch.major} requested ({describe(branch)})")
        gate.require_branch(branch, f"{raw.strip()!r} (R{branch.major})", catalog, reasons)
        check_support(found, branch.major, f"branch R{branch.major}")
        return branch
    if value == "latest":
        branch, _ = catalog.newest_release()
        reasons.append(f"'latest': the newest release in the catalog is in {describe(branch)}")
        gate.require_branch(branch, f"{raw.strip()!r} (R{branch.major})", catalog, reasons)
        check_support(found, branch.major, f"'latest' (R{branch.major})")
        return branch
    if value in ("production", "lts"):
        types = (LTS,) if value == "lts" else (PRODUCTION, LTS)
        candidates = catalog.of_types(*types)
        if not candidates:
            raise UnknownVersion(f"the catalog ({catalog.source}) lists no {value} branch")
        branch = candidates[0]
        reasons.append(
            f"'{value}': the newest {_track_words(value)} is {describe(branch)}"
        )
        gate.require_branch(branch, f"{raw.strip()!r} (R{branch.major})", catalog, reasons)
        check_support(found, branch.major, f"'{value}' (R{branch.major})")
        return branch
    return _auto_branch(catalog, found, track, reasons, gate)


def _auto_branch(catalog: Catalog, found: list[Gpu], track: str, reasons: list[str],
                 gate: FloorGate) -> Branch:
    legacy = [g for g in found if g.model.legacy_branch and g.model.last_branch is not None]
    if legacy:
        branch = _legacy_branch(catalog, found, legacy, reasons)
        if gate.release_in(branch) is None:
            raise NoReleaseMeetsFloors(
                f"{describe(branch)}, the only branch for {_labels(legacy)}, has no release "
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
            reasons.append(f"auto: skipped {describe(branch)}: no release of it meets the "
                           f"floor {floor_ids(stopped)}")
            continue
        if not blockers:
            if found:
                reasons.append(
                    f"auto (track {track}): {describe(branch)} is the newest {words} "
                    "supporting every GPU found" + (" and meeting the floors" if floored else "")
                )
            else:
                reasons.append(f"auto (track {track}): {describe(branch)} is the newest {words}"
                               + (" meeting the floors" if floored else ""))
            return branch
        reasons.append(
            f"auto: skipped {describe(branch)}: it does not support {_labels(blockers)}"
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
                f"{describe(branch)}"
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
        f"auto: using {describe(branch)} whatever the track: it is the legacy branch, the "
        f"only one for {_labels(legacy)}"
    )
    return branch


def check_support(found: list[Gpu], major: int, what: str) -> None:
    blockers = [g for g in found if not g.model.supports_branch(major)]
    if blockers:
        raise UnsupportedGpu(f"{what} cannot drive these GPUs: {_ranges(blockers)}")


# --- flavour choice ----------------------------------------------------------------------


def flavour_options(found: list[Gpu], major: int, module_type: str) -> list[str]:
    """The flavours a release of `major` could still be built in for these GPUs."""
    if module_type in (OPEN, PROPRIETARY):
        return [module_type]
    allowed = {OPEN, PROPRIETARY}
    for gpu in found:
        allowed &= gpu.model.flavours
    if major < FIRST_OPEN_BRANCH:
        allowed.discard(OPEN)
    return sorted(allowed) or [OPEN, PROPRIETARY]


def check_flavours_compatible(found: list[Gpu]) -> None:
    only_open = [g for g in found if g.model.flavours == {OPEN}]
    only_proprietary = [g for g in found if g.model.flavours == {PROPRIETARY}]
    if only_open and only_proprietary:
        raise IncompatibleGpus(
            "one driver cannot serve these GPUs together: open kernel modules only: "
            f"{_labels(only_open)}; proprietary kernel modules only: {_labels(only_proprietary)}"
        )


def choose_flavour(
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
        reasons.append(f"kernel modules: {spare}: the floor {floor_ids(stopped)} stops the "
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


def gpu_reasons(found: list[Gpu]) -> list[str]:
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


def floor_ids(floors: Sequence[Floor]) -> str:
    return ", ".join(f"{f.id} ({f.asks()})" for f in floors)


def describe(branch: Branch) -> str:
    return f"R{branch.major} ({branch.type})"


def released(release: Release) -> str:
    return f"released {release.date}" if release.date else "release date unknown"


def _track_words(track: str) -> str:
    return "LTS branch" if track == "lts" else "production or LTS branch"
