"""build_runfile(): a fake NVIDIA-Linux-x86_64-<version>.run made with the real makeself."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from . import cache, runfile_header, staging

KIT_DIR = Path(__file__).parent
DEFAULT_KERNEL_SOURCE = KIT_DIR / "kernel"
VERSION_PATTERN = re.compile(r"^[1-9][0-9]*\.[0-9]+(\.[0-9]+)?$")
# Fixed so the same inputs give byte-identical archives.
PACKAGING_DATE = "Thu Jan  1 00:00:00 UTC 2024"


def runfile_name(version: str) -> str:
    return f"NVIDIA-Linux-x86_64-{version}.run"


def build_runfile(
    version: str,
    dest_dir: Path,
    *,
    compile_error: bool = False,
    kernel_source: Optional[Path] = None,
) -> Path:
    """Put NVIDIA-Linux-x86_64-<version>.run and its .sha256sum into dest_dir; return the .run.

    kernel_source is the Kbuild tree shipped as kernel/ and kernel-open/ (default: the kit's
    fake modules); compile_error=True appends a C syntax error to every .c file in it.
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
    key = f"{version}-{'compile-error' if compile_error else 'ok'}-{cache.tree_digest(inputs)[:16]}"
    entry = cache.cached_dir(key, lambda work: _build(version, work, source, compile_error))
    dest_dir.mkdir(parents=True, exist_ok=True)
    name = runfile_name(version)
    shutil.copy2(entry / name, dest_dir / name)
    shutil.copy2(entry / f"{name}.sha256sum", dest_dir / f"{name}.sha256sum")
    return dest_dir / name


def _build(version: str, out_dir: Path, kernel_source: Path, compile_error: bool) -> None:
    name = runfile_name(version)
    with tempfile.TemporaryDirectory(prefix="kit-stage.") as scratch:
        payload = Path(scratch) / f"NVIDIA-Linux-x86_64-{version}"
        payload.mkdir()
        staging.stage(version, payload, kernel_source, compile_error)
        header = runfile_header.write_header(version, Path(scratch) / "header.sh")
        subprocess.run(
            [
                "makeself",
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
                f"{staging.DESCRIPTION} {version}",
                "./nvidia-installer",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    digest = hashlib.sha256((out_dir / name).read_bytes()).hexdigest()
    (out_dir / f"{name}.sha256sum").write_text(f"{digest}  {name}\n")
