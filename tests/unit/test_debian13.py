"""Debian 13 (trixie): the release is supported, its kernels' gcc-14 has an image tag, and the
deb822 debian.sources a trixie system carries is what the private apt reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from lib.hosttrees import make_host

from installer import distros
from installer.distros import apt
from installer.errors import UnsupportedDistro
from installer.headers import compiler
from installer.host import distro_from_os_release
from installer.hostroot import HostRoot

# As the debian:trixie image writes it (two stanzas, snapshot comments between the fields).
TRIXIE_SOURCES = (
    "Types: deb\n# http://snapshot.debian.org/archive/debian/20251115T000000Z\n"
    "URIs: http://deb.debian.org/debian\nSuites: trixie trixie-updates\nComponents: main\n"
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
    "Types: deb\n# http://snapshot.debian.org/archive/debian-security/20251115T000000Z\n"
    "URIs: http://deb.debian.org/debian-security\nSuites: trixie-security\nComponents: main\n"
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
)
# A trixie kernel's /proc/version (Debian builds 6.12 with trixie's gcc-14).
PROC_VERSION = (
    "Linux version 6.12.118+deb13-amd64 (debian-kernel@lists.debian.org) (x86_64-linux-gnu-"
    "gcc-14 (Debian 14.2.0-19) 14.2.0, GNU ld (GNU Binutils for Debian) 2.44) #1 SMP "
    "PREEMPT_DYNAMIC Debian 6.12.118-1\n"
)


def test_debian_13_is_supported_and_14_is_not(tmp_path: Path) -> None:
    make_host(tmp_path, distro="debian-13")
    found = distro_from_os_release((tmp_path / "etc/os-release").read_text(), "os-release")
    assert (found.id, found.version_id, found.family) == ("debian", "13", "debian")
    family = distros.supporting("debian", "13", "Debian GNU/Linux 13 (trixie)")
    assert family.headers_package("6.12.118+deb13-amd64") == "linux-headers-6.12.118+deb13-amd64"
    with pytest.raises(UnsupportedDistro, match="unsupported distribution version"):
        distros.supporting("debian", "14", "Debian GNU/Linux 14 (forky)")


def test_trixie_kernels_need_gcc_14_which_the_debian13_tag_carries() -> None:
    assert compiler.kernel_gcc_major(PROC_VERSION) == 14
    assert distros.image_compilers()["debian13"] == (14,)
    assert compiler.tags_with(14)[0] == "debian13"
    assert distros.for_compiler_package("gcc-14") is distros.named("debian")


def test_trixies_debian_sources_is_read_with_both_stanzas(tmp_path: Path) -> None:
    parts = tmp_path / "etc/apt/sources.list.d"
    parts.mkdir(parents=True)
    (parts / "debian.sources").write_text(TRIXIE_SOURCES)
    root = HostRoot(tmp_path)
    # Trixie has no /etc/apt/sources.list at all.
    assert apt.source_files(root) == [apt.SOURCES_PARTS / "debian.sources"]
    keyring = f"{tmp_path}/usr/share/keyrings/debian-archive-keyring.gpg"
    assert apt.rewrite_deb822(TRIXIE_SOURCES, root, None) == TRIXIE_SOURCES.replace(
        "/usr/share/keyrings/debian-archive-keyring.gpg", keyring)
    work = tmp_path / "work"
    apt.prepare(root, work, "x86_64", None)
    written = (work / "sources.list.d/00-debian.sources").read_text()
    assert written.count("Types: deb\n") == 2 and "Suites: trixie-security" in written
    assert written.count(f"Signed-By: {keyring}") == 2
