"""An rpm's files unpacked without installing it: what every rpm family's header fetch does with
the packages it downloaded."""

from __future__ import annotations

from pathlib import Path


def unpack_argv(rpm: Path, tree: Path) -> list[str]:
    """Unpack an rpm's files only (no scriptlets, no rpm database)."""
    return ["sh", "-c", 'cd "$2" && rpm2cpio "$1" > .payload.cpio && '
            'cpio -idm --quiet --no-absolute-filenames < .payload.cpio; rc=$?; '
            'rm -f .payload.cpio; exit $rc', "sh", str(rpm), str(tree)]
