"""What a .run says it is, checked against the plan before anything on the host changes."""

from __future__ import annotations

from pathlib import Path

from lib.fakes import FakeRunner
from lib.hosttrees import make_host, root_env

from installer import planner
from installer.config import from_env
from installer.sources.installed import module_version_matches
from installer.sources.runfile.identity import (
    archive_problems,
    header_identity,
    tree_problems,
)
from installer.sources.runfile.steps import copy_firmware

V = "580.105.08"


def write_run(path: Path, label: str, version_line: str | None) -> Path:
    lines = ["#!/bin/sh", 'CRCsum="1"', f'label="{label}"', 'script="./nvidia-installer"']
    if version_line is not None:
        lines.append(f'version="{version_line}"')
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"\x1f\x8b\x08\x00payload")
    return path


def test_a_matching_archive_has_no_problems(tmp_path: Path) -> None:
    run = write_run(tmp_path / "x.run",
                    f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {V}", V)
    assert archive_problems(header_identity(run), V, "x86_64") == []


def test_another_architecture_is_named(tmp_path: Path) -> None:
    run = write_run(tmp_path / "x.run",
                    f"NVIDIA Accelerated Graphics Driver for Linux-aarch64 {V}", V)
    assert archive_problems(header_identity(run), V, "x86_64") == [
        "its label names architecture aarch64"]


def test_another_version_is_named_by_every_witness(tmp_path: Path) -> None:
    other = "580.126.20"
    run = write_run(tmp_path / "x.run",
                    f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {other}", other)
    assert archive_problems(header_identity(run), V, "x86_64") == [
        f"its label names version {other}",
        f"its header's version line says {other}",
    ]


def test_a_file_without_an_nvidia_label_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "x.run"
    page.write_text("<html>captive portal</html>\n")
    assert archive_problems(header_identity(page), V, "x86_64") == [
        "its header has no NVIDIA driver label"]


def test_the_extracted_tree_must_name_the_version(tmp_path: Path) -> None:
    (tmp_path / f"libnvidia-ml.so.{V}").write_bytes(b"")
    other = "580.126.20"
    assert tree_problems(tmp_path, f"\nnvidia-installer:  version {V}\n", V) == []
    assert tree_problems(tmp_path, f"nvidia-installer:  version {other}", V) == [
        f"its nvidia-installer --version says {other}"]
    assert tree_problems(tmp_path, f"nvidia-installer:  version {other}", other) == [
        f"it has no libnvidia-ml.so.{other}"]


def test_module_version_is_read_from_modinfo(tmp_path: Path) -> None:
    ko = tmp_path / "nvidia.ko"
    ko.write_bytes(b"\x7fELF....\0license=Dual MIT/GPL\0version=" + V.encode()
                   + b"\0srcversion=ABC\0")
    assert module_version_matches(ko, V)
    assert not module_version_matches(ko, "580.105.0")
    assert not module_version_matches(tmp_path / "missing.ko", V)


def test_firmware_is_copied_from_the_tree(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "firmware").mkdir(parents=True)
    (tree / "firmware/gsp_ga10x.bin").write_bytes(b"fw")
    (tree / "firmware/README").write_text("not firmware")
    dest = tmp_path / "versions/v/firmware"
    assert copy_firmware(tree, dest) == ["gsp_ga10x.bin"]
    assert (dest / "gsp_ga10x.bin").read_bytes() == b"fw"
    assert (dest / "gsp_ga10x.bin").stat().st_mode & 0o777 == 0o644
    assert copy_firmware(tree, dest) == []
    assert copy_firmware(tmp_path / "no-firmware", tmp_path / "empty") == []
    assert (tmp_path / "empty").is_dir()


def test_everything_is_staged_before_the_old_driver_is_unloaded(tmp_path: Path) -> None:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", gpus=[0x2330])
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=V))
    plan = planner.make_plan(config, FakeRunner(), fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)
    names = [s.name for s in plan.steps]
    assert names[names.index("install-userspace"):names.index("load-modules") + 1] == [
        "install-userspace",
        "check-driver-free",
        "install-module-files",
        "install-firmware",
        "unload-old-driver",
        "activate-install",
        "configure-ld-cache",
        "load-modules",
    ]
