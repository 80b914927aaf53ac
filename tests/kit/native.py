"""Compiling the fake driver's shared libraries with gcc, with their real sonames."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import NamedTuple

NATIVE_SOURCES = Path(__file__).with_name("payload") / "native"
KERNEL_SOURCES = Path(__file__).with_name("kernel")

# cuDriverGetVersion per branch (CUDA version the driver branch first shipped with).
CUDA_VERSION_BY_BRANCH = {
    470: 11040,
    510: 11060,
    515: 11070,
    525: 12000,
    535: 12020,
    545: 12030,
    550: 12040,
    555: 12050,
    560: 12060,
    565: 12070,
    570: 12080,
    575: 12090,
    580: 13000,
}


class Library(NamedTuple):
    stem: str
    soname: str
    sources: tuple[str, ...]
    file_type: str


LIBRARIES = (
    Library(
        "libnvidia-ml",
        "libnvidia-ml.so.1",
        ("nvml_system.c", "nvml_device.c", "nvml_fabric.c", "kstate.c"),
        "UTILITY_LIB",
    ),
    Library("libnvidia-cfg", "libnvidia-cfg.so.1", ("soname_stub.c",), "UTILITY_LIB"),
    Library("libcuda", "libcuda.so.1", ("cuda.c", "kstate.c"), "CUDA_LIB"),
    Library(
        "libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1", ("soname_stub.c",), "CUDA_LIB"
    ),
    Library("libnvidia-nvvm", "libnvidia-nvvm.so.4", ("soname_stub.c",), "CUDA_LIB"),
)


def cuda_version(version: str) -> int:
    branch = int(version.split(".")[0])
    known = [b for b in sorted(CUDA_VERSION_BY_BRANCH) if b <= branch]
    return CUDA_VERSION_BY_BRANCH[known[-1]] if known else 11000


def compile_library(library: Library, version: str, dest_dir: Path, cc: str = "gcc") -> Path:
    """Compile `library` with `cc` (aarch64-linux-gnu-gcc for an aarch64 .run)."""
    output = dest_dir / f"{library.stem}.so.{version}"
    argv = [
        cc,
        "-shared",
        "-fPIC",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fvisibility=hidden",
        f'-DNV_VERSION="{version}"',
        f"-DNV_CUDA_VERSION={cuda_version(version)}",
        f"-Wl,-soname,{library.soname}",
        f"-I{KERNEL_SOURCES}",  # nvfake-ioctl.h, the kit's calls into its module
        "-o",
        str(output),
        *(str(NATIVE_SOURCES / source) for source in library.sources),
        "-ldl",  # libcuda dlopens the PTX JIT compiler (a separate library before glibc 2.34)
    ]
    subprocess.run(argv, check=True)
    return output
