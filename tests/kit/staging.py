"""Assembling the payload directory that makeself archives: NVIDIA's .run layout."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from . import native

if TYPE_CHECKING:
    from .real_parts import RealParts

PAYLOAD = Path(__file__).with_name("payload")
DESCRIPTION = "NVIDIA Accelerated Graphics Driver for Linux-x86_64"
# The C compiler of the libraries an .run of each architecture carries.
LIBRARY_CC = {"x86_64": "gcc", "aarch64": "aarch64-linux-gnu-gcc"}
FOREIGN_INSTALLER = """#!/bin/sh
# The kit's {arch} nvidia-installer: NVIDIA's is an {arch} program, which no other machine can
# execute (the shell says so and exits 126), so neither does this one.
if [ "$(uname -m)" != {arch} ]; then
    echo "$0: cannot execute binary file: Exec format error" >&2
    exit 126
fi
exec python3 "$(dirname "$0")/nvidia-installer.py" "$@"
"""


def description(arch: str) -> str:
    return DESCRIPTION.replace("x86_64", arch)
SCRIPTED_TOOLS = ("nvidia-smi", "nvidia-modprobe")
# Scripts that carry their version (@VERSION@ in the payload file): nvidia-persistenced shows it
# to the kit's nvidia.ko, which refuses a daemon of another driver version, as NVIDIA's does.
VERSIONED_TOOLS = ("nvidia-persistenced",)
STUB_TOOLS = (
    "nvidia-debugdump",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
# The modules the kit's kernel tree builds (NVIDIA's manifest lists nvidia-peermem too).
KERNEL_MODULES = ("nvidia", "nvidia-modeset", "nvidia-drm", "nvidia-uvm")
REAL_KERNEL_MODULES = (*KERNEL_MODULES, "nvidia-peermem")
# What NVIDIA's own files replace in a .run built from the real parts.
REAL_TOOLS = ("nvidia-smi", "nvidia-modprobe")
REAL_LIBRARIES = ("libnvidia-ml", "libcuda")
COMPILE_ERROR = "\nint nvfake_injected_compile_error = ;\n"

STUB_TOOL_SCRIPT = """#!/bin/sh
# Test kit stand-in for NVIDIA's {name}: it only reports its version.
case "$1" in
-v | --version) echo "{name}: version {version}"; exit 0 ;;
esac
echo "{name}: the test kit does not implement this tool" >&2
exit 1
"""


def stage(
    version: str,
    dest: Path,
    kernel_source: Path,
    compile_error: bool,
    real: Optional[RealParts] = None,
    arch: str = "x86_64",
    kernel_trees: Optional[Path] = None,
) -> None:
    """Fill dest with the payload; dest's name becomes the default extraction directory.
    With `real`, kernel/, kernel-open/, nvidia-smi, nvidia-modprobe, libnvidia-ml, libcuda and
    the GSP firmware are NVIDIA's own (the other files stay the kit's)."""
    if arch == "x86_64":
        shutil.copy2(PAYLOAD / "nvidia-installer", dest / "nvidia-installer")
    else:
        shutil.copy2(PAYLOAD / "nvidia-installer", dest / "nvidia-installer.py")
        (dest / "nvidia-installer").write_text(FOREIGN_INSTALLER.replace("{arch}", arch))
        (dest / "nvidia-installer").chmod(0o755)
    shutil.copytree(
        PAYLOAD / "nvidia_installer",
        dest / "nvidia_installer",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for directory, flavour in (("kernel", "proprietary"), ("kernel-open", "open")):
        if kernel_trees is not None:
            shutil.copytree(kernel_trees / directory, dest / directory, symlinks=True)
            continue
        if real is not None:
            shutil.copytree(real.directory / directory, dest / directory, symlinks=True)
            continue
        copy_kernel_sources(kernel_source, dest / directory, compile_error)
        # The version and flavour live in the tree, as NVIDIA's Kbuild carries its version.
        (dest / directory / "nv-kit.mk").write_text(
            f"NV_VERSION := {version}\nNV_FLAVOUR := {flavour}\n")
    modules = REAL_KERNEL_MODULES if real or kernel_trees else KERNEL_MODULES
    manifest = [description(arch), version, " ".join(modules)]
    # NVIDIA's own programs are x86_64 ones: an aarch64 .run carries the kit's scripts.
    native_real = real if arch == "x86_64" else None
    for tool in SCRIPTED_TOOLS:
        source = native_real.file(tool) if native_real is not None else PAYLOAD / tool
        shutil.copy2(source, dest / tool)
        (dest / tool).chmod(0o755)
    for tool in STUB_TOOLS:
        (dest / tool).write_text(STUB_TOOL_SCRIPT.format(name=tool, version=version))
        (dest / tool).chmod(0o755)
    for tool in VERSIONED_TOOLS:
        (dest / tool).write_text((PAYLOAD / tool).read_text().replace("@VERSION@", version))
        (dest / tool).chmod(0o755)
    for tool in (*SCRIPTED_TOOLS, *VERSIONED_TOOLS, *STUB_TOOLS):
        mode = "4755" if tool == "nvidia-modprobe" else "0755"
        manifest.append(f"{tool} {mode} UTILITY_BINARY")
    for library in native.LIBRARIES:
        if native_real is not None and library.stem in REAL_LIBRARIES:
            built = dest / f"{library.stem}.so.{version}"
            shutil.copy2(native_real.file(built.name), built)
        else:
            built = native.compile_library(library, version, dest, LIBRARY_CC[arch])
        manifest.append(f"{built.name} 0755 {library.file_type}")
    (dest / "firmware").mkdir()
    for name in FIRMWARE:
        if real is not None:
            shutil.copy2(real.firmware / name, dest / "firmware" / name)
        else:
            (dest / "firmware" / name).write_bytes(
                f"NVFAKE GSP firmware {name} {version}\n".encode())
        manifest.append(f"firmware/{name} 0644 FIRMWARE")
    (dest / "supported-gpus").mkdir()
    shutil.copy2(PAYLOAD / "supported-gpus.json", dest / "supported-gpus" / "supported-gpus.json")
    manifest.append("supported-gpus/supported-gpus.json 0644 DOCUMENTATION supported-gpus")
    shutil.copy2(PAYLOAD / "LICENSE", dest / "LICENSE")
    manifest.append("LICENSE 0644 DOCUMENTATION")
    (dest / ".manifest").write_text("\n".join(manifest) + "\n")


def copy_kernel_sources(source: Path, dest: Path, compile_error: bool) -> None:
    shutil.copytree(
        source,
        dest,
        ignore=shutil.ignore_patterns(
            "*.o", "*.ko", "*.mod", "*.mod.c", "*.cmd", "modules.order", "Module.symvers"
        ),
    )
    if compile_error:
        for c_file in sorted(dest.rglob("*.c")):
            with c_file.open("a") as handle:
                handle.write(COMPILE_ERROR)
