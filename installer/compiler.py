"""The compiler for module builds: the kernel's gcc major, the image's gcc, the tag that has it."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from installer.errors import CompilerMissing
from installer.runner import Runner

_GCC_IN_PROC_VERSION = re.compile(r"gcc[^)]*?\)?\s*(?:version\s+)?(\d+)\.(\d+)(?:\.\d+)?")
_GCC_VERSION_CONFIG = re.compile(r"^CONFIG_GCC_VERSION=(\d+)$", re.MULTILINE)

# The installer's image tags and the gcc majors each carries (images/ builds them).
IMAGE_COMPILERS: dict[str, tuple[int, ...]] = {
    "debian12": (12,),
    "ubuntu20.04": (9, 10),
    "ubuntu22.04": (11, 12),
    "ubuntu24.04": (12, 13, 14),
    "rocky8": (8,),
    "rocky9": (11,),
}


def kernel_gcc_major(proc_version: str | None) -> int | None:
    """The gcc major the kernel was built with, from /proc/version."""
    if not proc_version:
        return None
    match = _GCC_IN_PROC_VERSION.search(proc_version)
    return int(match.group(1)) if match else None


def headers_gcc_major(tree: Path) -> int | None:
    """The gcc major recorded in a header tree's config (`CONFIG_GCC_VERSION=120200`)."""
    for name in ("include/config/auto.conf", ".config"):
        try:
            text = (tree / name).read_text(errors="replace")
        except OSError:
            continue
        match = _GCC_VERSION_CONFIG.search(text)
        if match:
            return int(match.group(1)) // 10000
    return None


def tags_with(major: int) -> list[str]:
    return [tag for tag, majors in IMAGE_COMPILERS.items() if major in majors]


@dataclass(frozen=True)
class Compiler:
    """The gcc a build uses: `env` selects it (CC=gcc-N), `note` says why."""

    env: dict[str, str]
    note: str


def image_default_major(runner: Runner) -> int | None:
    result = runner.run(["gcc", "-dumpversion"], check=False)
    found = result.output.strip().split(".")[0]
    return int(found) if result.ok and found.isdigit() else None


def choose(runner: Runner, kernel_major: int | None) -> Compiler | None:
    """A gcc of the image matching `kernel_major`; None when the image has none. Reads only."""
    versioned = f"gcc-{kernel_major}"
    if kernel_major is not None and shutil.which(versioned):
        return Compiler({"CC": versioned}, f"{versioned} from the image (the kernel's gcc)")
    ours = image_default_major(runner) if shutil.which("gcc") else None
    if kernel_major is None:
        return Compiler({}, f"gcc {ours} from the image (the kernel's gcc is unknown)")
    if ours == kernel_major:
        return Compiler({}, f"gcc {ours} from the image (the kernel's gcc)")
    return None


def missing_error(kernel: str, kernel_major: int, source: str, runner: Runner) -> CompilerMissing:
    """compiler-missing naming the compiler and the image tags that carry it."""
    ours = image_default_major(runner) if shutil.which("gcc") else None
    tags = tags_with(kernel_major)
    use = (f"use the installer image tag {' or '.join(tags)}, which carries gcc-{kernel_major}"
           if tags else f"no installer image carries gcc-{kernel_major}; build one that does")
    return CompilerMissing(
        f"kernel {kernel} was built with gcc {kernel_major} ({source}) and this image has "
        f"{'gcc ' + str(ours) if ours else 'no gcc'} and no gcc-{kernel_major}: modules built "
        "with another compiler major fail to build or load",
        hint=f"Compiler gcc-{kernel_major}: {use}.",
    )
