"""Which installed kernel is the next one: newer than the kernel a run installs for, of the same
flavour, with `/lib/modules/<K>/modules.dep` and `/boot/vmlinuz-<K>` both on the host (what a
kernel package's install leaves; a removed kernel's leftover module dir has no modules.dep)."""

from __future__ import annotations

import re
from typing import NamedTuple

from installer.hostroot import HostRoot

_RELEASE = r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}$"
_NUMBERS = r"^\d+(?:[.-]\d+)*"
# A distro tag between the numbers and the architecture (.el9_4., .fc41., .amzn2023.) changes
# with every minor release: it is not part of the flavour.
_DISTRO_TAG = r"\.[a-z]+\d+(?:_\d+)*(?=\.)"


class ReleaseKey(NamedTuple):
    """A kernel release split into its numbers (compared as numbers) and its flavour."""

    numbers: tuple[int, ...]
    flavour: str


def release_key(release: str) -> ReleaseKey | None:
    """`6.1.0-56-amd64` -> ((6, 1, 0, 56), "-amd64"); `5.14.0-427.13.1.el9_4.x86_64` ->
    ((5, 14, 0, 427, 13, 1), ".x86_64"); None when the release does not start with numbers."""
    found = re.match(_NUMBERS, release)
    if found is None:
        return None
    numbers = tuple(int(n) for n in re.split(r"[.-]", found.group(0)))
    return ReleaseKey(numbers, re.sub(_DISTRO_TAG, "", release[found.end():]))


def _numbers(release: str) -> tuple[int, ...]:
    key = release_key(release)
    return key.numbers if key else ()


def is_newer(candidate: str, current: str) -> bool:
    """`candidate` is a later release of the same flavour as `current`."""
    new, old = release_key(candidate), release_key(current)
    return (new is not None and old is not None and new.flavour == old.flavour
            and new.numbers > old.numbers)


def is_installed(root: HostRoot, release: str) -> bool:
    """Both files a kernel package's install leaves are there (read-only)."""
    return (root.local_resolved(f"/lib/modules/{release}/modules.dep").is_file()
            and root.local_resolved(f"/boot/vmlinuz-{release}").is_file())


def pending_kernel(root: HostRoot, current: str, running: str | None = None) -> str | None:
    """The newest kernel installed on the host that is newer than `current` (the kernel the run
    installs for), other than `running`; None when there is none. Reads only."""
    modules = root.local_resolved("/lib/modules")
    try:
        names = [entry.name for entry in modules.iterdir()]
    except OSError:
        return None
    found = [name for name in names
             if re.fullmatch(_RELEASE, name) and name not in (current, running)
             and is_newer(name, current) and is_installed(root, name)]
    return max(found, key=_numbers) if found else None


