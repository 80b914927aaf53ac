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
from installer.errors import CompilerInstallFailed, UnsupportedDistro
from installer.headers import compiler, fetch, trees
from installer.hostroot import HostRoot

K = "6.4.0-150600.23.7-default"


class Suse(Family):
    """A stand-in for the next family: what SUSE/zypper support would add, in one class."""

    name = "suse"
    releases: ClassVar[dict[str, tuple[str, ...]]] = {"sles": ("15",)}
    image_tool = "zypper"
    sources_where = "/etc/zypp/repos.d"
    image_tags: ClassVar[dict[str, tuple[int, ...]]] = {"sles15": (7,)}

    def headers_package(self, kernel: str) -> str:
        return f"kernel-default-devel-{kernel.rsplit('-', 1)[0]}"

    def source_files(self, root: HostRoot) -> list[PurePosixPath]:
        base = root.local("/etc/zypp/repos.d")
        return sorted(PurePosixPath("/etc/zypp/repos.d") / p.name for p in base.glob("*.repo"))

    def fetch_headers(self, *args: Any) -> list[str]:
        raise NotImplementedError

    def ib_modules_package(self, distro: Any, kernel: str) -> str:
        return f"kernel-default-{kernel}"

    def owns_compiler_package(self, package: str) -> bool:
        return package.startswith("gcc") and package[3:].isdigit()

    def compiler_install_argvs(self, package: str) -> list[list[str]]:
        return [["zypper", "--non-interactive", "install", package]]


def test_every_family_answers_each_question() -> None:
    debian, rhel = distros.named("debian"), distros.named("rhel")
    assert (debian.headers_package(K), rhel.headers_package(K)) == (
        f"linux-headers-{K}", f"kernel-devel-{K}")
    assert (debian.image_tool, rhel.image_tool) == ("apt-get", "dnf")
    assert (debian.package_sources, rhel.package_sources) == ((), ("dnf",))
    assert distros.for_compiler_package("gcc-12") is debian
    assert distros.for_compiler_package("gcc-toolset-13-gcc") is rhel
    assert distros.for_compiler_package("gcc13") is None
    assert list(distros.image_compilers()) == [
        "debian12", "debian13", "ubuntu20.04", "ubuntu22.04", "ubuntu24.04", "ubuntu26.04",
        "rocky8", "rocky9", "rocky10"]


def test_an_unknown_family_is_an_error_never_a_default() -> None:
    with pytest.raises(UnsupportedDistro, match="no distro family 'suse'"):
        distros.named("suse")
    with pytest.raises(UnsupportedDistro):
        trees.headers_package("suse", K)
    assert distros.for_os_release("sles") is None


def test_a_compiler_package_no_family_installs_is_not_offered(tmp_path: Path) -> None:
    listed = tmp_path / "compiler-packages"
    listed.write_text("13 gcc13 /usr/bin/gcc-13\n12 gcc-12 /usr/bin/gcc-12\n")
    assert compiler.installable(13, listed) is None
    assert compiler.installable(12, listed) == compiler.Installable(12, "gcc-12", "/usr/bin/gcc-12")
    with pytest.raises(CompilerInstallFailed, match="installs the compiler package 'gcc13'"):
        compiler.Installable(13, "gcc13", "/usr/bin/gcc-13").install_argvs()


def test_a_new_family_is_one_class_and_one_registration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distros, "FAMILIES", (*distros.FAMILIES, Suse()))
    make_host(tmp_path, distro="debian-12", kernel=K)
    write_os_release(tmp_path, "sles", "15.6", pretty_name="SLES 15 SP6")
    (tmp_path / "etc/zypp/repos.d").mkdir(parents=True)
    (tmp_path / "etc/zypp/repos.d/repo-oss.repo").write_text("[repo-oss]\n")
    facts = host.gather(HostRoot(tmp_path), free_space_path=tmp_path)
    assert (facts.distro.family, facts.distro.major) == ("suse", 15)
    monkeypatch.setattr(fetch.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    source = fetch.plan_source(HostRoot(tmp_path), from_env({}), facts)
    assert source.tool == "zypper"
    assert source.package == "kernel-default-devel-6.4.0-150600.23.7"
    assert "/etc/zypp/repos.d/repo-oss.repo" in source.where
    error = trees.missing_headers_error(K, "suse")
    assert "Install kernel-default-devel-6.4.0-150600.23.7 on the host" in error.hint
    assert compiler.Installable(7, "gcc7", "/usr/bin/gcc-7").install_argvs() == [
        ["zypper", "--non-interactive", "install", "gcc7"]]


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
