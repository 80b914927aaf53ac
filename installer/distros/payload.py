"""A downloaded package's files unpacked without installing it: what every family's header fetch
does with the .deb or .rpm files its tool downloaded (no maintainer scripts or scriptlets run,
no package database is written)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from installer.errors import CommandFailed, HeadersFetchFailed

if TYPE_CHECKING:
    from pathlib import Path

    from installer.runner import Runner


def rpm_argv(rpm: Path, tree: Path) -> list[str]:
    """Unpack an rpm's files only; the payload is staged in `tree` and removed either way."""
    return ["sh", "-c", 'cd "$2" && rpm2cpio "$1" > .payload.cpio && '
            'cpio -idm --quiet --no-absolute-filenames < .payload.cpio; rc=$?; '
            'rm -f .payload.cpio; exit $rc', "sh", str(rpm), str(tree)]


def deb_argv(deb: Path, tree: Path) -> list[str]:
    """Unpack a .deb's files only."""
    return ["dpkg-deb", "--extract", str(deb), str(tree)]


def unpack(runner: Runner, packages: list[Path], tree: Path, what: str) -> None:
    """Unpack each of `packages` (.deb or .rpm) into `tree`, made when missing. Raises
    HeadersFetchFailed naming `what` (the packages and where they came from) when one fails."""
    try:
        tree.mkdir(parents=True, exist_ok=True)
        for package in packages:
            argv = rpm_argv if package.suffix == ".rpm" else deb_argv
            runner.run(argv(package, tree), timeout=600)
    except CommandFailed as exc:
        raise HeadersFetchFailed(f"unpacking {what} failed: {exc}") from exc
