"""The cross build's own decisions: the make argv, the arch checks on headers and kbuild, the
manifest identity of a tree whose nvidia-installer cannot run here."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.errors import HeadersWrongArch, KbuildToolsWrongArch
from installer.sources.runfile import cross
from installer.sources.runfile.identity import manifest_problems


def elf(path: Path, machine: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = bytearray(64)
    head[:4] = b"\x7fELF"
    head[4], head[5] = 2, 1  # 64-bit, little-endian
    head[18:20] = machine.to_bytes(2, "little")
    path.write_bytes(bytes(head))
    return path


def test_make_argv_is_nvidias_makefile_with_the_cross_toolchain() -> None:
    variables = cross._variables(cross.ARCHES["aarch64"], "aarch64-linux-gnu-gcc-12")
    argv = cross.make_argv(Path("/tmp/b/kernel-open"), "/usr/src/linux-headers-6.1.0-47-common",
                           "/usr/src/linux-headers-6.1.0-47-arm64", variables, jobs=3)
    assert argv == [
        "make", "-C", "/tmp/b/kernel-open", "-j3", "NV_EXCLUDE_KERNEL_MODULES=nvidia-drm",
        "SYSSRC=/usr/src/linux-headers-6.1.0-47-common",
        "SYSOUT=/usr/src/linux-headers-6.1.0-47-arm64",
        "ARCH=arm64", "CC=aarch64-linux-gnu-gcc-12", "CROSS_COMPILE=aarch64-linux-gnu-",
        "LD=aarch64-linux-gnu-ld", "modules",
    ]


def test_headers_of_the_target_arch_pass(tmp_path: Path) -> None:
    (tmp_path / ".config").write_text("CONFIG_CC_IS_GCC=y\nCONFIG_ARM64=y\n")
    cross.check_headers(tmp_path, "aarch64", "6.1.0-47-arm64")


def test_headers_of_another_arch_are_refused(tmp_path: Path) -> None:
    (tmp_path / ".config").write_text("CONFIG_X86_64=y\n# CONFIG_ARM64 is not set\n")
    with pytest.raises(HeadersWrongArch, match="configured for x86_64, not aarch64"):
        cross.check_headers(tmp_path, "aarch64", "6.1.0-56-amd64")


def test_headers_without_a_config_are_refused(tmp_path: Path) -> None:
    with pytest.raises(HeadersWrongArch, match=r"no \.config"):
        cross.check_headers(tmp_path, "aarch64", "6.1.0-47-arm64")


def test_kbuild_programs_of_the_builder_pass_and_of_the_target_are_refused(
        tmp_path: Path) -> None:
    mine = cross.ARCHES[cross.builder_arch()].elf_machine
    elf(tmp_path / cross.KBUILD_HOST_TOOL, mine)
    cross.check_kbuild_tools(tmp_path, "6.1.0-47-arm64")
    other = 183 if mine == 62 else 62
    elf(tmp_path / cross.KBUILD_HOST_TOOL, other)
    with pytest.raises(KbuildToolsWrongArch, match="make cannot run it"):
        cross.check_kbuild_tools(tmp_path, "6.1.0-47-arm64")


def test_elf_machine_reads_only_elf_files(tmp_path: Path) -> None:
    assert cross.elf_machine(elf(tmp_path / "a.ko", 183)) == 183
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert cross.elf_machine(tmp_path / "script") is None
    assert cross.elf_machine(tmp_path / "absent") is None


def test_a_manifest_names_the_tree_version(tmp_path: Path) -> None:
    assert manifest_problems(tmp_path, "535.261.03") == ["it has no .manifest"]
    (tmp_path / ".manifest").write_text(
        "NVIDIA Accelerated Graphics Driver for Linux-aarch64\n535.261.03\nnvidia\n")
    assert manifest_problems(tmp_path, "535.261.03") == []
    assert manifest_problems(tmp_path, "550.54.15") == [
        "its .manifest names version 535.261.03"]

