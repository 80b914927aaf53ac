"""installer.distros: every per-family answer comes from the family's class; an unknown family is
an error, and a new family is one class plus one registration entry."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import pytest
from lib import hostreleases
from lib.hostreleases import HostRelease, Kernel
from lib.hosttrees import make_host, write_os_release

from installer import distros, host
from installer.config import from_env
from installer.distros import Family
from installer.distros.family import HeaderFetch
from installer.errors import CompilerInstallFailed, UnsupportedDistro
from installer.headers import compiler, fetch, trees
from installer.hostroot import HostRoot

K = "6.4.0-150600.23.7-default"
ALPINE_K = "6.12.13-0-lts"


class ApkFetch:
    """What distros/apk.py would be: the host's /etc/apk/repositories, and its fetch."""

    def source_files(self, root: HostRoot) -> list[PurePosixPath]:
        found = PurePosixPath("/etc/apk/repositories")
        return [found] if root.local(found).is_file() else []

    def fetch(self, *args: Any) -> list[str]:
        raise NotImplementedError


class Alpine(Family):
    """A stand-in for the next family: what Alpine/apk support would add, in one class."""

    name = "alpine"
    releases: ClassVar[dict[str, tuple[str, ...]]] = {"alpine": ("3.21",)}
    image_tool = "apk"
    sources_where = "/etc/apk/repositories"
    image_tags: ClassVar[dict[str, tuple[int, ...]]] = {"alpine3.21": (14,)}

    def headers_package(self, kernel: str) -> str:
        return f"linux-{kernel.rsplit('-', 1)[1]}-dev"

    def header_fetch(self) -> HeaderFetch:
        return ApkFetch()

    def ib_modules_package(self, distro: Any, kernel: str) -> str:
        return f"linux-{kernel.rsplit('-', 1)[1]}"

    def owns_compiler_package(self, package: str) -> bool:
        return package == "gcc"

    def compiler_install_argvs(self, package: str) -> list[list[str]]:
        return [["apk", "add", "--no-cache", package]]


def test_every_family_answers_each_question() -> None:
    debian, rhel, suse = distros.named("debian"), distros.named("rhel"), distros.named("suse")
    assert (debian.headers_package(K), rhel.headers_package(K), suse.headers_package(K)) == (
        f"linux-headers-{K}", f"kernel-devel-{K}", "kernel-default-devel-6.4.0-150600.23.7")
    assert (debian.image_tool, rhel.image_tool, suse.image_tool) == ("apt-get", "dnf", "zypper")
    assert (debian.package_sources, rhel.package_sources, suse.package_sources) == (
        (), ("dnf",), ())
    assert distros.for_compiler_package("gcc-12") is debian
    assert distros.for_compiler_package("gcc-toolset-13-gcc") is rhel
    assert distros.for_compiler_package("gcc13") is suse
    assert distros.for_compiler_package("clang13") is None
    assert list(distros.image_compilers()) == [
        "debian12", "debian13", "ubuntu20.04", "ubuntu22.04", "ubuntu24.04", "ubuntu26.04",
        "rocky8", "rocky9", "rocky10", "sles15"]


def test_an_unknown_family_is_an_error_never_a_default() -> None:
    with pytest.raises(UnsupportedDistro, match="no distro family 'alpine'"):
        distros.named("alpine")
    with pytest.raises(UnsupportedDistro):
        trees.headers_package("alpine", ALPINE_K)
    assert distros.for_os_release("alpine") is None


def test_a_compiler_package_no_family_installs_is_not_offered(tmp_path: Path) -> None:
    listed = tmp_path / "compiler-packages"
    listed.write_text("13 clang13 /usr/bin/clang-13\n12 gcc-12 /usr/bin/gcc-12\n")
    assert compiler.installable(13, listed) is None
    assert compiler.installable(12, listed) == compiler.Installable(12, "gcc-12", "/usr/bin/gcc-12")
    with pytest.raises(CompilerInstallFailed, match="installs the compiler package 'clang13'"):
        compiler.Installable(13, "clang13", "/usr/bin/clang-13").install_argvs()


def test_a_new_family_is_one_class_and_one_registration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distros, "FAMILIES", (*distros.FAMILIES, Alpine()))
    make_host(tmp_path, distro="debian-12", kernel=ALPINE_K)
    write_os_release(tmp_path, "alpine", "3.21", pretty_name="Alpine Linux v3.21")
    (tmp_path / "etc/apk").mkdir(parents=True)
    (tmp_path / "etc/apk/repositories").write_text(
        "https://dl-cdn.alpinelinux.org/alpine/v3.21/main\n")
    facts = host.gather(HostRoot(tmp_path), free_space_path=tmp_path)
    assert (facts.distro.family, facts.distro.major) == ("alpine", 3)
    monkeypatch.setattr(fetch.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    source = fetch.plan_source(HostRoot(tmp_path), from_env({}), facts)
    assert source.tool == "apk"
    assert source.package == "linux-lts-dev"
    assert "/etc/apk/repositories" in source.where
    error = trees.missing_headers_error(ALPINE_K, "alpine")
    assert "Install linux-lts-dev on the host" in error.hint
    assert compiler.Installable(14, "gcc", "/usr/bin/gcc").install_argvs() == [
        ["apk", "add", "--no-cache", "gcc"]]


@pytest.mark.parametrize(("release", "kernel"), hostreleases.kernel_params())
def test_each_host_names_its_headers_package_flavour_and_image(
        tmp_path: Path, release: HostRelease, kernel: Kernel) -> None:
    write_os_release(tmp_path, release.id, release.version_id)
    distro = host.detect_distro(HostRoot(tmp_path))
    family = distros.of(distro)
    assert family.headers_package(kernel.release) == kernel.headers_package
    assert family.kernel_flavour(kernel.release) == kernel.flavour
    assert family.image_tag(distro) == release.image_tag
    assert release.image_tag in compiler.IMAGE_COMPILERS


def test_amazon_linux_and_oracle_offer_the_dnf_source() -> None:
    """NVIDIA's rhel repos serve Oracle Linux as they serve RHEL; AL2023 has its amzn2023 repo
    (tests/unit/test_dnf_commands.py)."""
    assert distros.named("amazon").package_sources == ("dnf",)
    assert distros.for_os_release("ol") is distros.named("rhel")
    assert "dnf" in distros.named("rhel").package_sources


@pytest.mark.parametrize(("distro_id", "version_id", "nearest"), hostreleases.unsupported_params())
def test_an_unsupported_release_names_the_nearest_supported(
        tmp_path: Path, distro_id: str, version_id: str, nearest: str) -> None:
    write_os_release(tmp_path, distro_id, version_id)
    with pytest.raises(UnsupportedDistro) as info:
        host.detect_distro(HostRoot(tmp_path))
    assert info.value.exit_code == 14
    assert info.value.message.endswith(f"the nearest supported release is {nearest}")


def test_debian_13_is_supported_and_14_is_not(tmp_path: Path) -> None:
    trixie = hostreleases.release("debian-13")
    make_host(tmp_path, distro="debian-13")
    found = host.distro_from_os_release((tmp_path / "etc/os-release").read_text(), "os-release")
    assert (found.id, found.version_id, found.family) == ("debian", "13", "debian")
    # Its kernel's headers package: test_each_host_names_its_headers_package_flavour_and_image.
    assert distros.supporting("debian", "13", trixie.pretty_name) is distros.named("debian")
    with pytest.raises(UnsupportedDistro, match="unsupported distribution version"):
        distros.supporting("debian", "14", "Debian GNU/Linux 14 (forky)")
