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
