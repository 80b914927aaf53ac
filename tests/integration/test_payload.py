"""installer.distros.payload with the real dpkg-deb: a package's files land in the tree, its
maintainer scripts never run, and a broken package is a HeadersFetchFailed naming it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from installer.distros import payload
from installer.errors import HeadersFetchFailed
from installer.runner import SubprocessRunner

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")


def build_deb(top: Path, marker: Path) -> Path:
    tree = top / "pkg"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        "Package: linux-headers-posed\nVersion: 1\nArchitecture: all\n"
        "Maintainer: tests <t@example.invalid>\nDescription: posed\n")
    postinst = tree / "DEBIAN/postinst"
    postinst.write_text(f"#!/bin/sh\ntouch {marker}\n")
    postinst.chmod(0o755)
    (tree / "usr/src/linux-headers-posed").mkdir(parents=True)
    (tree / "usr/src/linux-headers-posed/Makefile").write_text("all:\n")
    deb = top / "linux-headers-posed_1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
                   check=True, capture_output=True)
    return deb


def test_a_debs_files_are_unpacked_and_its_scripts_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "postinst-ran"
    deb = build_deb(tmp_path, marker)
    payload.unpack(SubprocessRunner(), [deb], tmp_path / "work/root", "posed from here")
    assert (tmp_path / "work/root/usr/src/linux-headers-posed/Makefile").read_text() == "all:\n"
    assert not (tmp_path / "work/root/DEBIAN").exists()
    assert not marker.exists()


def test_a_broken_package_is_a_fetch_failure_naming_it(tmp_path: Path) -> None:
    broken = tmp_path / "linux-headers-posed_1_all.deb"
    broken.write_bytes(b"!<arch>\nnot a package")
    with pytest.raises(HeadersFetchFailed, match="unpacking linux-headers-posed from the mirror "
                       "failed"):
        payload.unpack(SubprocessRunner(), [broken], tmp_path / "root", "linux-headers-posed "
                       "from the mirror")
