from __future__ import annotations

from pathlib import Path

import pytest
from lib import hostreleases
from lib.fakes import FakeRunner
from lib.hostreleases import HostRelease

from installer import distros
from installer.config import build_config
from installer.headers import compiler


@pytest.mark.parametrize(("text", "major"), [
    ("Linux version 6.1.0-56-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian "
     "12.2.0-14+deb12u1) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP", 12),
    ("Linux version 5.15.0-105-generic (buildd@lcy02-amd64-007) (gcc (Ubuntu "
     "11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #115-Ubuntu", 11),
    ("Linux version 5.14.0-427.13.1.el9_4.x86_64 (mockbuild@iad1-prod-build001.bld.equ.rockylinux"
     ".org) (gcc (GCC) 11.4.1 20231218 (Red Hat 11.4.1-3), GNU ld version 2.35.2-43.el9) #1", 11),
    (None, None),
])
def test_kernel_gcc_from_proc_version(text: str | None, major: int | None) -> None:
    assert compiler.kernel_gcc_major(text) == major



def test_gcc_major_from_the_headers_config(tmp_path: Path) -> None:
    (tmp_path / "include/config").mkdir(parents=True)
    (tmp_path / "include/config/auto.conf").write_text(
        'CONFIG_CC_VERSION_TEXT="gcc-12 (Debian 12.2.0-14) 12.2.0"\nCONFIG_GCC_VERSION=120200\n')
    assert compiler.headers_gcc_major(tmp_path) == 12
    assert compiler.headers_gcc_major(tmp_path / "absent") is None


def test_gcc_major_only_from_a_line_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "include/config").mkdir(parents=True)
    (tmp_path / "include/config/auto.conf").write_text(
        "# CONFIG_GCC_VERSION=110000\nXCONFIG_GCC_VERSION=100000\nCONFIG_GCC_VERSION=90000x\n"
        "CONFIG_GCC_VERSION=120200\n")
    assert compiler.headers_gcc_major(tmp_path) == 12
    (tmp_path / "include/config/auto.conf").write_text("XCONFIG_GCC_VERSION=100000\n")
    (tmp_path / ".config").write_text("CONFIG_GCC_VERSION=130100\n")
    assert compiler.headers_gcc_major(tmp_path) == 13


def test_versioned_gcc_of_the_kernel_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler.shutil, "which", lambda name: f"/usr/bin/{name}")
    chosen = compiler.choose(FakeRunner().on("gcc", output="12\n"), 11)
    assert chosen is not None and chosen.env == {"CC": "gcc-11"}


def test_default_gcc_of_the_same_major_needs_no_cc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler.shutil, "which",
                        lambda name: "/usr/bin/gcc" if name == "gcc" else None)
    chosen = compiler.choose(FakeRunner().on("gcc", "-dumpversion", output="12\n"), 12)
    assert chosen is not None and chosen.env == {}


@pytest.mark.parametrize(("major", "tags"), [
    (9, "ubuntu20.04"), (10, "ubuntu20.04"), (11, "ubuntu22.04 or rocky9"),
    (12, "debian12 or ubuntu22.04 or ubuntu24.04"), (13, "ubuntu24.04"),
    (14, "debian13 or ubuntu24.04 or ubuntu26.04 or rocky10"), (8, "rocky8"),
])
def test_no_matching_gcc_names_the_compiler_and_the_tag(monkeypatch: pytest.MonkeyPatch,
                                                         major: int, tags: str) -> None:
    monkeypatch.setattr(compiler.shutil, "which",
                        lambda name: "/usr/bin/gcc" if name == "gcc" else None)
    runner = FakeRunner().on("gcc", "-dumpversion", output="15\n")
    assert compiler.choose(runner, major) is None
    error = compiler.missing_error("5.4.0-200-generic", major, "/proc/version", runner)
    assert error.reference == "compiler-missing" and error.exit_code == 43
    assert f"built with gcc {major} (/proc/version)" in error.message
    assert "this image has gcc 15 and no gcc-" in error.message
    assert error.hint == f"Compiler gcc-{major}: use the installer image tag {tags}, which " \
        f"carries gcc-{major}."


# The image's package sources: the list the image's build writes, the install argv.
SOURCES = "11 gcc-11 /usr/bin/gcc-11\n12 gcc-12 /usr/bin/gcc-12\n13 gcc-13 /usr/bin/gcc-13\n"
TOOLSETS = ("12 gcc-toolset-12-gcc /opt/rh/gcc-toolset-12/root/usr/bin/gcc\n"
            "13 gcc-toolset-13-gcc /opt/rh/gcc-toolset-13/root/usr/bin/gcc\n")


def test_a_major_listed_by_the_images_sources_is_installable(tmp_path: Path) -> None:
    listed = tmp_path / "compiler-packages"
    listed.write_text(SOURCES)
    found = compiler.installable(11, listed)
    assert found == compiler.Installable(11, "gcc-11", "/usr/bin/gcc-11")
    assert found.install_argvs() == [
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "gcc-11"]]
    assert compiler.installable(9, listed) is None
    assert compiler.installable(None, listed) is None
    assert compiler.installable(11, tmp_path / "absent") is None  # not our image: a host run


def test_rocky_toolsets_install_with_dnf(tmp_path: Path) -> None:
    listed = tmp_path / "compiler-packages"
    listed.write_text(TOOLSETS)
    found = compiler.installable(13, listed)
    assert found is not None and found.manager == "dnf"
    assert found.install_argvs() == [["dnf", "install", "-y", "--setopt=install_weak_deps=False",
                                      "--nodocs", "gcc-toolset-13-gcc"]]


def test_the_list_is_found_through_the_images_setting(tmp_path: Path) -> None:
    listed = tmp_path / "compiler-packages"
    listed.write_text(SOURCES)
    config = build_config({"NVIDIA_INSTALLER_COMPILER_PACKAGES": str(listed)}, {})
    assert config.compiler_packages == listed
    assert compiler.installable(13, config.compiler_packages) == compiler.Installable(
        13, "gcc-13", "/usr/bin/gcc-13")
    # our images' path when unset (a host has no such file); empty: no list at all
    assert build_config({}, {}).compiler_packages == Path(
        "/usr/share/nvidia-driver-installer/compiler-packages")
    unset = build_config({"NVIDIA_INSTALLER_COMPILER_PACKAGES": ""}, {}).compiler_packages
    assert compiler.installable(13, unset) is None


def test_install_runs_the_images_package_manager(tmp_path: Path) -> None:
    runner = FakeRunner().on("apt-get")
    compiler.install(runner, compiler.Installable(11, "gcc-11", "/usr/bin/gcc-11"), "5.15.0-1")
    assert [list(c.argv) for c in runner.calls] == [
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "gcc-11"]]


def test_a_failed_install_names_package_kernel_and_tag() -> None:
    runner = FakeRunner().on("apt-get", "update").on(
        "apt-get", "install", returncode=100, output="E: Unable to locate package gcc-11\n")
    with pytest.raises(compiler.CompilerInstallFailed) as caught:
        compiler.install(runner, compiler.Installable(11, "gcc-11", "/usr/bin/gcc-11"),
                         "5.15.0-105-generic")
    error = caught.value
    assert error.reference == "compiler-install-failed" and error.exit_code == 45
    assert "kernel 5.15.0-105-generic needs gcc 11" in error.message
    assert "E: Unable to locate package gcc-11" in error.message
    assert "ubuntu22.04 or rocky9" in (error.hint or "")


def test_a_toolset_in_the_image_is_chosen_by_path(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    gcc = tmp_path / "opt/rh/gcc-toolset-13/root/usr/bin/gcc"
    gcc.parent.mkdir(parents=True)
    gcc.write_text("")
    monkeypatch.setattr(compiler, "TOOLSETS", tmp_path / "opt/rh")
    monkeypatch.setattr(compiler.shutil, "which", lambda name: None)
    chosen = compiler.choose(FakeRunner(), 13)
    assert chosen is not None and chosen.env == {"CC": str(gcc)}


@pytest.mark.parametrize("release", [
    pytest.param(release, id=release.name)
    for release in hostreleases.releases() if release.proc_version])
def test_a_kernels_proc_version_names_its_gcc_and_the_releases_image_carries_it(
        release: HostRelease) -> None:
    """Ubuntu and Debian name the compiler by its triplet (x86_64-linux-gnu-gcc-15); the
    release's image tag is the first to carry that gcc, and its family installs gcc-<major>."""
    assert compiler.kernel_gcc_major(release.proc_version) == release.gcc
    assert compiler.tags_with(release.gcc)[0] == release.image_tag
    if release.gcc_tags:
        assert compiler.tags_with(release.gcc) == list(release.gcc_tags)
    assert distros.image_compilers()[release.image_tag] == release.image_compilers
    assert distros.for_compiler_package(f"gcc-{release.gcc}") is distros.supporting(
        release.id, release.version_id, release.pretty_name)
