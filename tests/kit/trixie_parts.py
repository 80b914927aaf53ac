"""Debian 13 (trixie) from Debian's real archive: NVIDIA's 550.163.01 parts, the current 6.12
headers (split -amd64/-common plus the ABI's linux-kbuild) and a trixie image root with gcc-14.

Like kit.real_parts (whose private apt and unpacking this reuses), `fetch()` runs only from
scripts/install-deps: it downloads with a private apt state (nothing on the machine changes) and
caches outside the clone; tests call the `require_*` functions, which fail with a pointer to
install-deps when the cache is missing. The kernel is the one trixie's `linux-headers-amd64`
depends on when fetched (Debian's archive keeps only the current ABI); its name is recorded in
the cache, so tests never guess it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kit import real_parts
from kit.cache import mmdebstrap_tarball
from kit.real_parts import COMPLETE, PartsMissing, PrivateApt, RealParts, cache_root

SUITE = "trixie"
VERSION = "550.163.01"
DEBIAN_VERSION = f"{VERSION}-2"
GCC_MAJOR = 14
# nvidia-modprobe is its own source package in Debian; trixie's is 570.133.07.
DRIVER_PACKAGES = {
    "nvidia-kernel-source": DEBIAN_VERSION,
    "nvidia-open-kernel-source": DEBIAN_VERSION,
    "firmware-nvidia-gsp": DEBIAN_VERSION,
    "nvidia-smi": DEBIAN_VERSION,
    "libnvidia-ml1": DEBIAN_VERSION,
    "libcuda1": DEBIAN_VERSION,
    "nvidia-modprobe": "570.133.07-1",
}
# The installer's image root: what images/ubuntu/Dockerfile installs for debian13 that a build
# needs (gcc-14, make, libc6-dev, kmod, util-linux's unshare and mount, xz for the .run), the
# libraries trixie's linux-kbuild tools link against, and the installer's Python dependencies
# as Debian packages them (nvidia-ml-py is pure Python: the tests add it from this machine).
IMAGE_PACKAGES = (
    "python3", "python3-requests", "python3-click", "python3-tenacity", "python3-cryptography",
    "python3-yaml", f"gcc-{GCC_MAJOR}", "make", "libc6-dev", "libelf1t64", "libssl3t64",
    "zlib1g", "kmod", "util-linux", "mount", "xz-utils", "tar", "gzip", "apt",
)
MMDEBSTRAP_ARGS = ("--variant=minbase", "--mode=root", "--format=tar",
                   f"--include={','.join(IMAGE_PACKAGES)}", SUITE)
_KBUILD = re.compile(r"Depends:\s*(linux-kbuild-[0-9][^\s,]*)")
_HEADERS = re.compile(r"Depends:\s*(linux-headers-(\S+)-amd64)\b")


@dataclass(frozen=True)
class TrixieHeaders:
    """Trixie's split headers of one kernel unpacked into a root-shaped directory, and the
    .debs they came from (republished by the tests as a trixie archive on 127.0.0.1)."""

    root: Path
    kernel: str  # e.g. 6.12.118+deb13-amd64
    kbuild_package: str  # e.g. linux-kbuild-6.12.118+deb13
    debs: tuple[Path, ...]

    @property
    def base(self) -> str:
        return self.kernel.removesuffix("-amd64")

    @property
    def output(self) -> Path:
        return self.root / f"usr/src/linux-headers-{self.kernel}"

    @property
    def source(self) -> Path:
        return self.root / f"usr/src/linux-headers-{self.base}-common"

    @property
    def kbuild(self) -> Path:
        return self.root / "usr/lib" / self.kbuild_package

    @property
    def packages(self) -> tuple[str, ...]:
        return (f"linux-headers-{self.kernel}", f"linux-headers-{self.base}-common",
                self.kbuild_package)


def parts_dir(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / f"nvidia-{VERSION}"


def headers_dir(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "trixie-headers"


def image_key() -> str:
    return hashlib.sha256(json.dumps(MMDEBSTRAP_ARGS).encode()).hexdigest()[:12]


def image_tarball(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / f"trixie-image-root-{image_key()}.tar"


def _missing(what: str, where: Path) -> PartsMissing:
    return PartsMissing(f"{what} is not in {where}: run scripts/install-deps (it fetches it from "
                        "Debian's trixie archive with `python3 -m kit fetch-trixie-parts`; "
                        f"{real_parts.CACHE_ENV} moves the cache)")


def require_parts(cache: Path | None = None) -> RealParts:
    final = parts_dir(cache) / "parts"
    if not (final / COMPLETE).is_file():
        raise _missing(f"NVIDIA's real {VERSION} parts", final)
    return RealParts(final, VERSION, (final / COMPLETE).read_text())


def require_headers(cache: Path | None = None) -> TrixieHeaders:
    top = headers_dir(cache)
    if not (top / COMPLETE).is_file():
        raise _missing("trixie's 6.12 headers", top)
    record = json.loads((top / COMPLETE).read_text())
    return TrixieHeaders(top / "root", record["kernel"], record["kbuild"],
                         tuple(top / "debs" / name for name in record["debs"]))


def require_image(cache: Path | None = None) -> Path:
    tarball = image_tarball(cache)
    if not tarball.is_file():
        raise _missing("the trixie image root (mmdebstrap, gcc-14)", tarball)
    return tarball


# --- fetching (scripts/install-deps only: tests never reach the network) --------------------


def fetch(cache: Path | None = None, archive: str | None = None
          ) -> tuple[RealParts, TrixieHeaders, Path]:
    """Download and unpack what is missing; idempotent (a complete cache is not touched)."""
    cache = cache or cache_root()
    archive = archive or os.environ.get(real_parts.ARCHIVE_ENV) or "http://deb.debian.org/debian"
    apt: PrivateApt | None = None

    def private_apt() -> PrivateApt:
        nonlocal apt
        if apt is None:
            apt = PrivateApt(cache / "apt-private-trixie", archive, SUITE)
            apt.run("update")
        return apt

    if not (parts_dir(cache) / "parts" / COMPLETE).is_file():
        debs = private_apt().download(DRIVER_PACKAGES, parts_dir(cache) / "debs")
        real_parts._atomic(parts_dir(cache) / "parts",
                           lambda work: real_parts.unpack_parts(debs, work, VERSION))
    if not (headers_dir(cache) / COMPLETE).is_file():
        _fetch_headers(private_apt(), headers_dir(cache))
    mmdebstrap_tarball(image_tarball(cache), [*MMDEBSTRAP_ARGS, archive.rstrip("/")],
                       stale="trixie-image-root-*.tar", timeout=1800)
    return require_parts(cache), require_headers(cache), require_image(cache)


def _depends(apt: PrivateApt, package: str) -> str:
    return subprocess.run(["apt-cache", *apt.options(), "depends", package], check=True,
                          capture_output=True, text=True).stdout


def _fetch_headers(apt: PrivateApt, top: Path) -> None:
    found = _HEADERS.search(_depends(apt, "linux-headers-amd64"))
    if found is None:
        raise PartsMissing("trixie's linux-headers-amd64 names no linux-headers-<abi>-amd64")
    kernel = f"{found.group(2)}-amd64"
    kbuild = _KBUILD.search(_depends(apt, found.group(1)))
    if kbuild is None:
        raise PartsMissing(f"linux-headers-{kernel} depends on no linux-kbuild package")
    wanted = {found.group(1): "", f"linux-headers-{found.group(2)}-common": "",
              kbuild.group(1): ""}
    debs = apt.download(wanted, top / "debs")

    def unpack(work: Path) -> None:
        for deb in debs:
            real_parts._extract(deb, work)

    real_parts._atomic(top / "root", unpack)
    (top / COMPLETE).write_text(json.dumps(
        {"kernel": kernel, "kbuild": kbuild.group(1), "debs": [d.name for d in debs],
         "sha256": real_parts._digests(debs)}, indent=1))
