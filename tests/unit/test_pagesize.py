"""The kernel's page size (host/pagesize.py): from a kernel config's lines, and for a kernel
from its /boot config, then the headers' .config, then the kernel's name."""

from __future__ import annotations

from pathlib import Path

import pytest
from lib.hosttrees import make_host

from installer.host.pagesize import from_config, kernel_page_size


@pytest.mark.parametrize(("text", "size"), [
    ("CONFIG_ARM64=y\nCONFIG_ARM64_64K_PAGES=y\nCONFIG_ARM64_PAGE_SHIFT=16\n", 65536),
    ("CONFIG_ARM64_4K_PAGES=y\n", 4096),
    ("CONFIG_ARM64_16K_PAGES=y\n", 16384),
    ("CONFIG_ARM64_PAGE_SHIFT=16\n", 65536),
    ("# CONFIG_ARM64_64K_PAGES is not set\nCONFIG_X86_64=y\n", None),
])
def test_the_page_size_a_config_selects(text: str, size: int | None) -> None:
    assert from_config(text) == size


def test_page_size_from_boot_then_headers_then_the_name(tmp_path: Path) -> None:
    root = make_host(tmp_path / "host", distro="ubuntu-24.04", kernel="6.8.0-1036-nvidia-64k")
    k = "6.8.0-1036-nvidia-64k"
    assert kernel_page_size(root, k, "x86_64").size == 4096
    named = kernel_page_size(root, k, "aarch64")
    assert (named.size, "the kernel's name" in named.source) == (65536, True)
    assert kernel_page_size(root, "6.8.0-87-generic", "aarch64").size is None
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / ".config").write_text("CONFIG_ARM64_4K_PAGES=y\n")
    assert kernel_page_size(root, "6.8.0-87-generic", "aarch64", [tree]).size == 4096
    boot = tmp_path / "host/boot"
    boot.mkdir()
    (boot / f"config-{k}").write_text("CONFIG_ARM64_16K_PAGES=y\n")
    found = kernel_page_size(root, k, "aarch64", [tree])
    assert (found.size, found.source) == (16384, f"the kernel's config (/boot/config-{k})")
