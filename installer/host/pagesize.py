"""The page size a kernel runs with: its config in /boot on the host, else in its headers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from installer.hostroot import HostRoot

# arm64 kernels choose 4k, 16k or 64k pages at build time (arch/arm64/Kconfig);
# CONFIG_ARM64_PAGE_SHIFT (12, 14, 16) follows the choice.
_PAGES = re.compile(r"(?m)^CONFIG_ARM64_(?:(4|16|64)K_PAGES=y|PAGE_SHIFT=(\d+))$")
# RHEL's 64k kernel (`...el9_4.aarch64+64k`), Ubuntu's -nvidia-64k and -generic-64k.
_NAMED_64K = ("+64k", "-64k")


class PageSize(NamedTuple):
    """A kernel's page size in bytes (None: unknown) and where it was read."""

    size: int | None
    source: str

    def __str__(self) -> str:
        return f"{self.size // 1024} KiB" if self.size else "unknown"


def from_config(text: str) -> int | None:
    """The page size a kernel config selects (arm64's options), or None."""
    match = _PAGES.search(text)
    if match is None:
        return None
    if match.group(1):
        return int(match.group(1)) * 1024
    return 1 << int(match.group(2))


def kernel_page_size(root: HostRoot, kernel: str, arch: str,
                     trees: Sequence[Path] = ()) -> PageSize:
    """The page size of `kernel`: x86_64 has 4 KiB pages only; on aarch64 from
    /boot/config-<kernel> (host path), else a header tree's config (local paths), else a 64k
    suffix in the kernel's name. Reads only."""
    if arch != "aarch64":
        return PageSize(4096, f"{arch} kernels have 4 KiB pages only")
    boot = f"/boot/config-{kernel}"
    text = root.read_text(boot)
    found = from_config(text) if text else None
    if found:
        return PageSize(found, f"the kernel's config ({boot})")
    for tree in trees:
        for name in (".config", "include/config/auto.conf"):
            try:
                found = from_config((tree / name).read_text(errors="replace"))
            except OSError:
                continue
            if found:
                return PageSize(found, f"the headers' config ({tree / name})")
    if kernel.endswith(_NAMED_64K):
        return PageSize(65536, f"the kernel's name (no {boot} or headers config to read)")
    return PageSize(None, f"no {boot} on the host and no headers config to read")
