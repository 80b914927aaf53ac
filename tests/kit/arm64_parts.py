"""NVIDIA's real arm64 535.261.03 module sources and Debian's arm64 6.1.0-47 headers and kernel.

The arm64 half of kit.real_parts, for cross-building on this x86 machine: the same private apt
(its own sources, lists and cache; nothing installed), told that the machine is arm64 so that
`apt-get download` takes the arm64 builds. The headers' kbuild host tools (fixdep, modpost,
sign-file) must run here, so the kbuild package is the amd64 `linux-kbuild-6.1` kit.real_parts
already caches, not the arm64 one (whose tools are arm64 binaries). `scripts/install-deps` calls
`fetch()`; tests call `require()`, which fails with a pointer to install-deps.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kit import real_parts

VERSION = real_parts.VERSION
ABI = real_parts.OLD_ABI  # 6.1.0-47: the ABI both of NVIDIA's 535 flavours compile against
KERNEL = f"{ABI}-arm64"
DRIVER_PACKAGES = {
    "nvidia-kernel-source": real_parts.DEBIAN_VERSION,
    "nvidia-open-kernel-source": real_parts.DEBIAN_VERSION,
}
KERNEL_PACKAGES = {
    f"linux-headers-{KERNEL}": "6.1.170-3",
    f"linux-headers-{ABI}-common": "6.1.170-3",
    f"linux-image-{KERNEL}-unsigned": "6.1.170-3",
}
COMPLETE = real_parts.COMPLETE


@dataclass(frozen=True)
class Arm64Parts:
    """NVIDIA's arm64 module trees as the aarch64 .run lays them out, and Debian's arm64 kernel:
    its headers (with the amd64 kbuild) in a root-shaped tree, and its image."""

    directory: Path

    @property
    def kernel(self) -> Path:
        return self.directory / "parts/kernel"

    @property
    def kernel_open(self) -> Path:
        return self.directory / "parts/kernel-open"

    @property
    def headers_root(self) -> Path:
        return self.directory / "root"

    @property
    def headers(self) -> real_parts.HeaderTrees:
        return real_parts.HeaderTrees(self.headers_root, KERNEL)

    @property
    def vmlinuz(self) -> Path:
        return self.headers_root / f"boot/vmlinuz-{KERNEL}"

    @property
    def modules(self) -> Path:
        return self.headers_root / f"lib/modules/{KERNEL}"

    @property
    def debs(self) -> str:
        return (self.directory / COMPLETE).read_text()

    @property
    def busybox(self) -> Path:
        """Debian's arm64 busybox-static: the arm64 guest's whole user space."""
        return self.directory / "busybox/bin/busybox"


def parts_dir(cache: Path | None = None) -> Path:
    return (cache or real_parts.cache_root()) / f"nvidia-{VERSION}-arm64"


def require(cache: Path | None = None) -> Arm64Parts:
    found = parts_dir(cache)
    if not (found / COMPLETE).is_file():
        raise real_parts.PartsMissing(
            f"NVIDIA's real arm64 {VERSION} module sources and Debian's {KERNEL} kernel are not "
            f"in {found}: run scripts/install-deps (it fetches them with `python3 -m kit "
            f"fetch-real-parts`; {real_parts.CACHE_ENV} moves the cache)")
    return Arm64Parts(found)


class Arm64Apt(real_parts.PrivateApt):
    """The private apt, as if on an arm64 machine: downloads pick arm64 (and `all`) builds."""

    def options(self) -> list[str]:
        return [*super().options(), "-o", "APT::Architecture=arm64",
                "-o", "APT::Architectures=arm64"]


def fetch(cache: Path | None = None, archive: str | None = None) -> Arm64Parts:
    """Download and unpack what is missing; idempotent. Needs kit.real_parts' cache first (the
    amd64 kbuild comes from it)."""
    cache = cache or real_parts.cache_root()
    final = parts_dir(cache)
    archive = archive or os.environ.get(real_parts.ARCHIVE_ENV) or "http://deb.debian.org/debian"
    if (final / COMPLETE).is_file():
        found = require(cache)
        if not found.busybox.is_file():
            _fetch_busybox(Arm64Apt(cache / "apt-private-arm64", archive), final, update=True)
        return found
    amd64_headers = real_parts.headers_dir(cache) / "debs"
    kbuild = sorted(amd64_headers.glob("linux-kbuild-6.1_*_amd64.deb"))
    if not kbuild:
        raise real_parts.PartsMissing(f"no amd64 linux-kbuild-6.1 in {amd64_headers}: fetch "
                                      "kit.real_parts first")
    apt = Arm64Apt(cache / "apt-private-arm64", archive)
    apt.run("update")
    _fetch_busybox(apt, final, update=False)
    driver = apt.download(DRIVER_PACKAGES, final / "debs")
    kernel = apt.download(KERNEL_PACKAGES, final / "debs")
    final.mkdir(parents=True, exist_ok=True)
    real_parts._atomic(final / "parts", lambda work: _unpack_trees(driver, work))
    trees = [*kernel, kbuild[-1]]
    real_parts._atomic(final / "root", lambda work: [real_parts._extract(d, work) for d in trees])
    (final / COMPLETE).write_text(real_parts._digests([*driver, *trees]))
    return require(cache)


def _unpack_trees(debs: list[Path], dest: Path) -> None:
    """kernel/ and kernel-open/ as the aarch64 .run has them (no Debian packaging dir)."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="arm64-parts.", dir=dest.parent) as scratch:
        root = Path(scratch)
        for deb in debs:
            real_parts._extract(deb, root)
        for tarball, tree in (("nvidia-kernel.tar.xz", "kernel"),
                              ("nvidia-open-kernel.tar.xz", "kernel-open")):
            unpacked = root / f"unpacked-{tree}"
            unpacked.mkdir()
            subprocess.run(["tar", "-xJf", str(root / "usr/src" / tarball), "-C", str(unpacked)],
                           check=True)
            (module_dir,) = (unpacked / "modules").iterdir()
            shutil.rmtree(module_dir / "debian")
            shutil.move(str(module_dir), dest / tree)


def _fetch_busybox(apt: Arm64Apt, final: Path, *, update: bool) -> None:
    if update:
        apt.run("update")
    (deb,) = apt.download({"busybox-static": ""}, final / "debs")
    final.mkdir(parents=True, exist_ok=True)
    real_parts._atomic(final / "busybox", lambda work: real_parts._extract(deb, work))
