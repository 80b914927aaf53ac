"""NVIDIA's real driver parts (535.261.03) and a second 6.1 header ABI, from Debian's archive.

Debian's non-free/contrib components carry the real driver's parts repackaged from NVIDIA's
`.run` (see shared/reference/nvidia-runfile.md, "NVIDIA's real parts"). `fetch()` downloads them
with `apt-get download` on a private sources list, state and cache dir (nothing on the machine
changes: no package is installed, /var/lib/apt and /var/cache/apt are not written) and unpacks
them once into a cache outside the clone. `scripts/install-deps` calls it, so tests never reach
the network: they call `require()`, which fails with a pointer to install-deps when the cache is
missing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

VERSION = "535.261.03"
DEBIAN_VERSION = f"{VERSION}-1"
CACHE_ENV = "INSTALLER_TEST_CACHE"
ARCHIVE_ENV = "INSTALLER_TEST_DEBIAN_ARCHIVE"  # a mirror of deb.debian.org/debian (and -security)
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# package -> exact Debian version; nvidia-modprobe is its own source package in Debian.
DRIVER_PACKAGES = {
    "nvidia-kernel-source": DEBIAN_VERSION,
    "nvidia-open-kernel-source": DEBIAN_VERSION,
    "firmware-nvidia-gsp": DEBIAN_VERSION,
    "nvidia-smi": DEBIAN_VERSION,
    "libnvidia-ml1": DEBIAN_VERSION,
    "libcuda1": DEBIAN_VERSION,
    "nvidia-modprobe": "535.161.07-1~deb12u1",
}
# A second 6.1 ABI: NVIDIA's open 535.261.03 compiles against it (not against 6.1.0-56).
OLD_ABI = "6.1.0-47"
OLD_KERNEL = f"{OLD_ABI}-amd64"
OLD_HEADER_PACKAGES = {
    f"linux-headers-{OLD_KERNEL}": "6.1.170-3",
    f"linux-headers-{OLD_ABI}-common": "6.1.170-3",
    "linux-kbuild-6.1": "",  # the archive's current one (>= 6.1.170-3, as the headers depend)
}
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
COMPLETE = ".complete"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or "/var/cache/installer-test")


@dataclass(frozen=True)
class RealParts:
    """NVIDIA's parts as the .run lays them out (parts/), plus what they came from."""

    directory: Path
    version: str
    debs: str  # `<sha256>  <deb>` lines: what the parts were unpacked from

    @property
    def kernel(self) -> Path:
        return self.directory / "kernel"

    @property
    def kernel_open(self) -> Path:
        return self.directory / "kernel-open"

    @property
    def firmware(self) -> Path:
        return self.directory / "firmware"

    def file(self, name: str) -> Path:
        return self.directory / name


@dataclass(frozen=True)
class HeaderTrees:
    """Debian's split headers of one kernel, unpacked into a root-shaped directory."""

    root: Path
    kernel: str

    @property
    def output(self) -> Path:
        return self.root / f"usr/src/linux-headers-{self.kernel}"

    @property
    def source(self) -> Path:
        return self.root / f"usr/src/linux-headers-{self.kernel.removesuffix('-amd64')}-common"

    @property
    def kbuild(self) -> Path:
        return self.root / "usr/lib/linux-kbuild-6.1"


def parts_dir(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / f"nvidia-{VERSION}"


def headers_dir(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / f"linux-headers-{OLD_KERNEL}"


class PartsMissing(RuntimeError):
    pass


def require(cache: Path | None = None) -> RealParts:
    """The cached parts; PartsMissing naming scripts/install-deps when they are not there."""
    final = parts_dir(cache) / "parts"
    if not (final / COMPLETE).is_file():
        raise PartsMissing(
            f"NVIDIA's real {VERSION} parts are not in {final}: run scripts/install-deps (it "
            "fetches them from Debian's non-free archive with `python3 -m kit fetch-real-parts`; "
            f"{CACHE_ENV} moves the cache)")
    return RealParts(final, VERSION, (final / COMPLETE).read_text())


def require_old_headers(cache: Path | None = None) -> HeaderTrees:
    final = headers_dir(cache) / "root"
    if not (headers_dir(cache) / COMPLETE).is_file():
        raise PartsMissing(
            f"Debian's {OLD_KERNEL} headers are not in {final}: run scripts/install-deps (it "
            "fetches them with `python3 -m kit fetch-real-parts`)")
    return HeaderTrees(final, OLD_KERNEL)


# --- fetching (scripts/install-deps only: tests never reach the network) --------------------


def sources_list(archive: str, suite: str = "bookworm") -> str:
    base = archive.rstrip("/")
    security = base + "-security" if base.endswith("/debian") else base
    options = f"[signed-by={KEYRING}]"
    components = "main contrib non-free non-free-firmware"
    return (f"deb {options} {base} {suite} {components}\n"
            f"deb {options} {base} {suite}-updates {components}\n"
            f"deb {options} {security} {suite}-security {components}\n")


class PrivateApt:
    """apt-get with its own sources, lists, cache and (empty) dpkg status: the machine's apt
    configuration and state are neither read for sources nor written."""

    def __init__(self, directory: Path, archive: str, suite: str = "bookworm") -> None:
        self.directory = directory
        for sub in ("lists/partial", "cache/archives/partial", "etc"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        (directory / "etc/sources.list").write_text(sources_list(archive, suite))
        (directory / "status").touch()

    def options(self) -> list[str]:
        d = self.directory
        return [
            "-o", f"Dir::Etc::SourceList={d}/etc/sources.list",
            "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State={d}",
            "-o", f"Dir::State::Lists={d}/lists",
            "-o", f"Dir::State::status={d}/status",
            "-o", f"Dir::Cache={d}/cache",
            "-o", "Debug::NoLocking=1",
            "-o", "APT::Sandbox::User=root",
        ]

    def run(self, *args: str, cwd: Path | None = None) -> None:
        subprocess.run(["apt-get", "-q", *self.options(), *args], check=True, cwd=cwd,
                       stdout=subprocess.DEVNULL)

    def download(self, packages: dict[str, str], dest: Path) -> list[Path]:
        dest.mkdir(parents=True, exist_ok=True)
        wanted = [f"{name}={version}" if version else name for name, version in packages.items()]
        self.run("download", *wanted, cwd=dest)
        found = []
        for name, version in packages.items():
            pattern = f"{name}_{version.replace(':', '%3a')}_*.deb" if version else f"{name}_*.deb"
            matches = sorted(dest.glob(pattern))
            if not matches:
                raise PartsMissing(f"apt-get download left no {pattern} in {dest}")
            found.append(matches[-1])
        return found


def fetch(cache: Path | None = None, archive: str | None = None) -> tuple[RealParts, HeaderTrees]:
    """Download and unpack what is missing; idempotent (a complete cache is not touched)."""
    cache = cache or cache_root()
    archive = archive or os.environ.get(ARCHIVE_ENV) or "http://deb.debian.org/debian"
    apt: PrivateApt | None = None

    def private_apt() -> PrivateApt:
        nonlocal apt
        if apt is None:
            apt = PrivateApt(cache / "apt-private", archive)
            apt.run("update")
        return apt

    if not (parts_dir(cache) / "parts" / COMPLETE).is_file():
        debs = private_apt().download(DRIVER_PACKAGES, parts_dir(cache) / "debs")
        _atomic(parts_dir(cache) / "parts", lambda work: unpack_parts(debs, work))
    if not (headers_dir(cache) / COMPLETE).is_file():
        debs = private_apt().download(OLD_HEADER_PACKAGES, headers_dir(cache) / "debs")
        root = headers_dir(cache) / "root"
        _atomic(root, lambda work: [_extract(deb, work) for deb in debs])
        (headers_dir(cache) / COMPLETE).write_text(_digests(debs))
    return require(cache), require_old_headers(cache)


def unpack_parts(debs: list[Path], dest: Path, version: str = VERSION) -> None:
    """Lay the packages' files out as NVIDIA's .run has them."""
    with tempfile.TemporaryDirectory(prefix="real-parts.", dir=dest.parent) as scratch:
        root = Path(scratch)
        for deb in debs:
            _extract(deb, root)
        for tarball, tree in (("nvidia-kernel.tar.xz", "kernel"),
                              ("nvidia-open-kernel.tar.xz", "kernel-open")):
            unpacked = root / f"unpacked-{tree}"
            unpacked.mkdir()
            subprocess.run(["tar", "-xJf", str(root / "usr/src" / tarball), "-C", str(unpacked)],
                           check=True)
            (module_dir,) = (unpacked / "modules").iterdir()
            # Debian's module-assistant packaging; NVIDIA's .run has no debian/ dir.
            shutil.rmtree(module_dir / "debian")
            shutil.move(str(module_dir), dest / tree)
        nvidia = root / "usr/lib/x86_64-linux-gnu/nvidia/current"
        for library in (f"libnvidia-ml.so.{version}", f"libcuda.so.{version}"):
            shutil.copy2(nvidia / library, dest / library)
        shutil.copy2(root / "usr/lib/nvidia/current/nvidia-smi", dest / "nvidia-smi")
        shutil.copy2(root / "usr/bin/nvidia-modprobe", dest / "nvidia-modprobe")
        (dest / "firmware").mkdir()
        # Debian 13 is merged-/usr: its firmware packages ship under /usr/lib/firmware.
        firmware = next(d for d in (root / f"lib/firmware/nvidia/{version}",
                                    root / f"usr/lib/firmware/nvidia/{version}") if d.is_dir())
        for name in FIRMWARE:
            shutil.copy2(firmware / name, dest / "firmware" / name)
    (dest / COMPLETE).write_text(_digests(debs))


def _extract(deb: Path, dest: Path) -> None:
    subprocess.run(["dpkg-deb", "--extract", str(deb), str(dest)], check=True)


def _digests(debs: list[Path]) -> str:
    return "".join(f"{hashlib.sha256(deb.read_bytes()).hexdigest()}  {deb.name}\n"
                   for deb in debs)


def _atomic(final: Path, produce: Callable[[Path], object]) -> None:
    """Build `final` in a sibling temp dir and rename it into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        produce(work)
        os.chmod(work, 0o755)
        if final.exists():
            shutil.rmtree(final)
        os.rename(work, final)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
