"""build_runfile(): a fake NVIDIA-Linux-x86_64-<version>.run made with the real makeself."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from . import cache, runfile_header, staging

if TYPE_CHECKING:
    from .arm64_parts import Arm64Parts
    from .real_parts import RealParts

KIT_DIR = Path(__file__).parent
DEFAULT_KERNEL_SOURCE = KIT_DIR / "kernel"
VERSION_PATTERN = re.compile(r"^[1-9][0-9]*\.[0-9]+(\.[0-9]+)?$")
# Fixed so the same inputs give byte-identical archives.
PACKAGING_DATE = "Thu Jan  1 00:00:00 UTC 2024"


def runfile_name(version: str, arch: str = "x86_64") -> str:
    return f"NVIDIA-Linux-{arch}-{version}.run"


def build_runfile(
    version: str,
    dest_dir: Path,
    *,
    compile_error: bool = False,
    kernel_source: Optional[Path] = None,
    arch: str = "x86_64",
) -> Path:
    """Put NVIDIA-Linux-<arch>-<version>.run and its .sha256sum into dest_dir; return the .run.

    kernel_source is the Kbuild tree shipped as kernel/ and kernel-open/ (default: the kit's
    fake modules); compile_error=True appends a C syntax error to every .c file in it. An
    aarch64 .run carries the kit's libraries cross-compiled for aarch64 and an nvidia-installer
    that runs only on an aarch64 machine (staging.FOREIGN_INSTALLER).
    Built archives are cached (see cache.CACHE_ENV); raises CalledProcessError if a build fails.
    """
    if not VERSION_PATTERN.match(version):
        raise ValueError(f"not an NVIDIA driver version: {version!r}")
    source = Path(kernel_source or DEFAULT_KERNEL_SOURCE).resolve()
    inputs = [
        KIT_DIR / "payload",
        KIT_DIR / "runfile_preparse.sh",
        runfile_header.STOCK_HEADER,
        *sorted(KIT_DIR.glob("*.py")),
        source,
    ]
    outcome = "compile-error" if compile_error else "ok"
    prefix = "" if arch == "x86_64" else f"{arch}-"
    key = f"{prefix}{version}-{outcome}-{cache.tree_digest(inputs)[:16]}"
    entry = cache.cached_dir(
        key, lambda work: _build(version, work, source, compile_error, arch=arch))
    dest_dir.mkdir(parents=True, exist_ok=True)
    name = runfile_name(version, arch)
    shutil.copy2(entry / name, dest_dir / name)
    shutil.copy2(entry / f"{name}.sha256sum", dest_dir / f"{name}.sha256sum")
    return dest_dir / name


def build_real_runfile(dest_dir: Path, parts: Optional[RealParts] = None,
                       *, pad_to: int = 0) -> Path:
    """NVIDIA-Linux-x86_64-535.261.03.run whose kernel/ and kernel-open/ trees, nvidia-smi,
    nvidia-modprobe, libnvidia-ml, libcuda and GSP firmware are NVIDIA's real ones (from
    kit.real_parts; the installer, other tools and libraries are the kit's). `pad_to` (bytes)
    adds an incompressible `.kit-padding` file so the archive has a real driver's size, for
    benchmarks. Cached like build_runfile."""
    from . import real_parts

    parts = parts or real_parts.require()
    version = parts.version
    inputs = [
        KIT_DIR / "payload",
        KIT_DIR / "runfile_preparse.sh",
        runfile_header.STOCK_HEADER,
        *sorted(KIT_DIR.glob("*.py")),
    ]
    parts_digest = hashlib.sha256(parts.debs.encode()).hexdigest()[:12]
    key = f"real-{version}-{parts_digest}-pad{pad_to}-{cache.tree_digest(inputs)[:16]}"
    entry = cache.cached_dir(
        key, lambda work: _build(version, work, DEFAULT_KERNEL_SOURCE, False, parts, pad_to))
    dest_dir.mkdir(parents=True, exist_ok=True)
    name = runfile_name(version)
    for file in (name, f"{name}.sha256sum"):
        shutil.copyfile(entry / file, dest_dir / file)
    (dest_dir / name).chmod(0o755)
    return dest_dir / name


def build_real_arm64_runfile(dest_dir: Path, parts: Optional[RealParts] = None,
                             arm64: Optional[Arm64Parts] = None) -> Path:
    """NVIDIA-Linux-aarch64-535.261.03.run whose kernel/ and kernel-open/ trees are NVIDIA's
    real arm64 ones (kit.arm64_parts) and whose GSP firmware is NVIDIA's; its libraries are the
    kit's, compiled for aarch64, and its nvidia-installer runs only on an aarch64 machine.
    Cached like build_runfile."""
    from . import arm64_parts, real_parts

    parts = parts or real_parts.require()
    arm64 = arm64 or arm64_parts.require()
    version = parts.version
    inputs = [
        KIT_DIR / "payload",
        KIT_DIR / "runfile_preparse.sh",
        runfile_header.STOCK_HEADER,
        *sorted(KIT_DIR.glob("*.py")),
    ]
    digest = hashlib.sha256((parts.debs + arm64.debs).encode()).hexdigest()[:12]
    key = f"real-aarch64-{version}-{digest}-{cache.tree_digest(inputs)[:16]}"
    entry = cache.cached_dir(key, lambda work: _build(
        version, work, DEFAULT_KERNEL_SOURCE, False, parts, arch="aarch64",
        kernel_trees=arm64.directory / "parts"))
    dest_dir.mkdir(parents=True, exist_ok=True)
    name = runfile_name(version, "aarch64")
    for file in (name, f"{name}.sha256sum"):
        shutil.copyfile(entry / file, dest_dir / file)
    (dest_dir / name).chmod(0o755)
    return dest_dir / name


def _build(version: str, out_dir: Path, kernel_source: Path, compile_error: bool,
           real: Optional[RealParts] = None, pad_to: int = 0, *, arch: str = "x86_64",
           kernel_trees: Optional[Path] = None) -> None:
    name = runfile_name(version, arch)
    with tempfile.TemporaryDirectory(prefix="kit-stage.") as scratch:
        payload = Path(scratch) / f"NVIDIA-Linux-{arch}-{version}"
        payload.mkdir()
        staging.stage(version, payload, kernel_source, compile_error, real, arch, kernel_trees)
        if pad_to:
            _pad(payload, pad_to)
        header = runfile_header.write_header(version, Path(scratch) / "header.sh", arch)
        # Real parts: gzip -6 (makeself's default is -9: three times the CPU, 0.2 % smaller).
        level = ["--complevel", "6"] if real is not None else []
        subprocess.run(
            [
                "makeself",
                *level,
                "--quiet",
                "--tar-quietly",
                "--nox11",
                "--nooverwrite",
                "--noprogress",
                "--header",
                str(header),
                "--packaging-date",
                PACKAGING_DATE,
                str(payload),
                str(out_dir / name),
                f"{staging.description(arch)} {version}",
                "./nvidia-installer",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    digest = hashlib.sha256()
    with (out_dir / name).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    (out_dir / f"{name}.sha256sum").write_text(f"{digest.hexdigest()}  {name}\n")


def _pad(payload: Path, size: int) -> None:
    """Random bytes (gzip cannot shrink them) so the compressed archive is about `size`."""
    have = sum(p.stat().st_size for p in payload.rglob("*") if p.is_file())
    missing = max(0, size - have // 2)  # the real trees compress to about half
    with (payload / ".kit-padding").open("wb") as handle:
        while missing > 0:
            chunk = min(missing, 1 << 20)
            handle.write(os.urandom(chunk))
            missing -= chunk
