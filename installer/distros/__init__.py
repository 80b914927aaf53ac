"""Distro families: one class per family answers every per-family question (header and compiler
packages, package manager, image tags, package sources, fetching through the host's sources).
Elsewhere code asks the family; it never tests a family's name. A new family is its own module
here plus one entry in FAMILIES."""

from __future__ import annotations

from typing import TYPE_CHECKING

from installer.distros.amazon import Amazon
from installer.distros.debian import Debian
from installer.distros.family import Facts, Family, PackageNotFound
from installer.distros.rhel import Rhel
from installer.distros.suse import Suse
from installer.errors import UnsupportedDistro

if TYPE_CHECKING:
    from installer.distros.family import Release

__all__ = [
    "FAMILIES",
    "Facts",
    "Family",
    "PackageNotFound",
    "Rhel",
    "dnf",
    "for_compiler_package",
    "for_os_release",
    "image_compilers",
    "named",
    "of",
    "supporting",
]

FAMILIES: tuple[Family, ...] = (Debian(), Rhel(), Amazon(), Suse())


def named(name: str) -> Family:
    """The family called `name`. Raises UnsupportedDistro for any other: an unknown family is
    never treated as one of the known ones."""
    for family in FAMILIES:
        if family.name == name:
            return family
    raise UnsupportedDistro(
        f"no distro family {name!r} (known: {', '.join(f.name for f in FAMILIES)})")


def of(distro: Release) -> Family:
    """The family of a detected distro."""
    return named(distro.family)


def for_os_release(distro_id: str) -> Family | None:
    """The family that knows os-release ID `distro_id`, or None."""
    for family in FAMILIES:
        if distro_id in family.releases:
            return family
    return None


def supporting(distro_id: str, version_id: str, found: str) -> Family:
    """The family that supports os-release ID `distro_id` at `version_id` (the decision host/
    asks for). Raises UnsupportedDistro naming `found` for any other distribution or version."""
    family = for_os_release(distro_id)
    if family is None or not version_id.split(".", 1)[0].isdigit():
        raise UnsupportedDistro(f"unsupported distribution: {found}")
    if not family.supports(distro_id, version_id):
        nearest = family.nearest_release(distro_id, version_id)
        raise UnsupportedDistro(f"unsupported distribution version: {found}; the nearest "
                                f"supported release is {nearest}")
    return family


def for_compiler_package(package: str) -> Family | None:
    """The family whose installer image installs compiler `package`, or None."""
    for family in FAMILIES:
        if family.owns_compiler_package(package):
            return family
    return None


def image_compilers() -> dict[str, tuple[int, ...]]:
    """Every installer image tag and the gcc majors it carries."""
    return {tag: majors for family in FAMILIES for tag, majors in family.image_tags.items()}
