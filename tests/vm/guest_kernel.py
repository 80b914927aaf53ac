"""Finds a kernel this machine can boot under qemu: its image, modules and headers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GuestKernel:
    release: str
    image: Path
    modules_dir: Path
    # Where its /boot and /lib/modules live: this machine's /, or a kernel's packages unpacked
    # elsewhere (tests/lib/secondkernel.py), which the guest sees through the 9p root.
    base: Path = Path("/")

    @property
    def build_dir(self) -> Path:
        """The kbuild tree for external modules (Debian's linux-headers-<release>)."""
        return self.modules_dir / "build"


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", release))


def find_guest_kernel(release: str | None = None, boot: Path = Path("/boot")) -> GuestKernel | None:
    """The named kernel, else the newest /boot/vmlinuz-* with modules; None if there is none."""
    candidates = []
    for image in boot.glob("vmlinuz-*"):
        found = image.name.removeprefix("vmlinuz-")
        modules_dir = Path("/lib/modules") / found
        if (modules_dir / "modules.dep").is_file() and release in (None, found):
            candidates.append(GuestKernel(found, image, modules_dir))
    if not candidates:
        return None
    return max(candidates, key=lambda kernel: _release_key(kernel.release))


def unpacked_guest_kernel(base: Path, release: str) -> GuestKernel:
    """A kernel whose packages are unpacked under `base` (boot/, lib/modules/ with depmod run)."""
    return GuestKernel(release, base / "boot" / f"vmlinuz-{release}",
                       base / "lib/modules" / release, base)
