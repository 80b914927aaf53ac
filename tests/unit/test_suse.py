"""installer.distros.suse and its header fetch (distros/zypper.py): SUSE's package names by
uname -r, the releases it takes, its gccN compilers, the host's repo files, and the exact zypper
and rpm commands the fetch runs on a private root (the real fetch against signed repos:
tests/integration/test_zypper_headers.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from lib import hostreleases
from lib.fakes import FakeRunner

from installer import distros
from installer.config import from_env
from installer.distros import PackageNotFound, zypper
from installer.distros.family import Facts
from installer.errors import HeadersFetchFailed
from installer.headers import compiler
from installer.host import Distro
from installer.hostroot import HostRoot

SLES = hostreleases.release("sles-15.6")
KERNEL = "6.4.0-150600.23.25-default"
PACKAGE = "kernel-default-devel-6.4.0-150600.23.25"
# A SLE 15 kernel's /proc/version (SP5's, as its kernel logs print it): SUSE's gcc 7.5.
SLE15_PROC_VERSION = (
    "Linux version 5.14.21-150500.55.52-default (geeko@buildhost) (gcc (SUSE Linux) 7.5.0, "
    "GNU ld (GNU Binutils; SUSE Linux Enterprise 15) 2.41.0.20230908-150100.7.46) #1 SMP "
    "PREEMPT_DYNAMIC Tue Mar 5 16:53:41 UTC 2024 (a62851f)\n")


def suse() -> distros.Family:
    return distros.named("suse")


@pytest.mark.parametrize(("kernel", "package", "flavour", "ib"), [
    ("6.4.0-150600.23.25-default", PACKAGE, "default", "kernel-default-6.4.0-150600.23.25"),
    ("6.4.0-150600.23.81-64kb", "kernel-64kb-devel-6.4.0-150600.23.81", "64kb",
     "kernel-64kb-6.4.0-150600.23.81"),
    ("6.4.0-150600.10.5-rt", "kernel-rt-devel-6.4.0-150600.10.5", "rt",
     "kernel-rt-6.4.0-150600.10.5"),
    # A PTF (program temporary fix) kernel: a long release, the flavour still the last part.
    ("6.4.0-150600.23.7.4.28314.3.PTF.1215587-default",
     "kernel-default-devel-6.4.0-150600.23.7.4.28314.3.PTF.1215587", "default",
     "kernel-default-6.4.0-150600.23.7.4.28314.3.PTF.1215587"),
])
def test_the_package_names_are_the_flavours_and_the_version_without_the_flavour(
        kernel: str, package: str, flavour: str, ib: str) -> None:
    distro = Distro("sles", "15.6", 15, "suse", SLES.pretty_name)
    assert suse().headers_package(kernel) == package
    assert suse().kernel_flavour(kernel) == flavour
    assert suse().ib_modules_package(distro, kernel) == ib


def test_sles_and_leap_15_6_are_taken_and_other_service_packs_name_it() -> None:
    assert distros.supporting("sles", "15.6", SLES.pretty_name) is suse()
    assert distros.supporting("opensuse-leap", "15.6", "openSUSE Leap 15.6") is suse()
    assert not suse().supports("sles", "15.5")
    assert not suse().supports("sles", "15.7")
    assert suse().nearest_release("sles", "15.7") == "SLES 15.6"
    assert suse().nearest_release("opensuse-leap", "15.5") == "openSUSE Leap 15.6"
    assert suse().nearest_release("opensuse-tumbleweed", "20261201") is None


def test_the_kernels_gcc_7_is_the_sles15_images_and_gccN_are_zyppers() -> None:
    major = compiler.kernel_gcc_major(SLE15_PROC_VERSION)
    assert major == 7
    assert compiler.tags_with(major) == ["sles15"]
    assert distros.for_compiler_package("gcc13") is suse()
    assert distros.for_compiler_package("gcc-13") is distros.named("debian")
    assert not suse().owns_compiler_package("gcc13-c++")
    installable = compiler.Installable(13, "gcc13", "/usr/bin/gcc-13")
    assert installable.manager == "zypper"
    assert installable.install_argvs() == [
        ["zypper", "--non-interactive", "install", "--no-recommends", "gcc13"]]


def write_files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_hosts_repo_files_are_its_dot_repo_files_in_name_order(tmp_path: Path) -> None:
    write_files(tmp_path, SLES.files)
    (tmp_path / "etc/zypp/repos.d/old.repo.rpmsave").write_text("[old]\n")
    (tmp_path / "etc/zypp/repos.d/sub.repo").mkdir()
    names = sorted(name.rsplit("/", 1)[1] for name in SLES.files)
    assert suse().source_files(HostRoot(tmp_path)) == [zypper.REPOS_DIR / n for n in names]
    assert suse().source_files(HostRoot(tmp_path / "empty")) == []


BASESYSTEM = ("[Basesystem]\nname=Basesystem\nenabled=1\nbaseurl=https://updates.example/bs/\n"
              "gpgkey=file:///etc/pki/repo.key\n")


def posed_host(root: Path) -> None:
    """A SLES root: the Basesystem repo (its key named by gpgkey=), a disabled and an unchecked
    repo (their keys never trusted), SUSE's build key, credentials and vars."""
    write_files(root, {
        "etc/zypp/repos.d/basesystem.repo": BASESYSTEM,
        "etc/zypp/repos.d/off.repo": "[off]\nenabled=0\nbaseurl=https://off.example/\n"
                                     "gpgkey=file:///etc/pki/off.key\n",
        "etc/zypp/repos.d/nocheck.repo": "[nocheck]\nenabled=1\ngpgcheck=0\n"
                                         "baseurl=https://nocheck.example/\n"
                                         "gpgkey=file:///etc/pki/nocheck.key\n",
        "etc/pki/repo.key": "repo key\n",
        "etc/pki/off.key": "off key\n",
        "etc/pki/nocheck.key": "nocheck key\n",
        "usr/lib/rpm/gnupg/keys/gpg-pubkey-39db7c82-5f68629b.asc": "SUSE key\n",
        "usr/lib/rpm/gnupg/keys/README": "not a key\n",
        "etc/zypp/credentials.d/SCCcredentials": "username=SCC_x\npassword=y\n",
        "etc/zypp/vars.d/DIST": "sles\n",
    })


def host_listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def fetching_runner(work: Path, packages: dict[str, str],
                    refresh_rc: int = 0, requires: dict[str, str] | None = None) -> FakeRunner:
    """zypper and rpm answering as they do: `download <capability>` writes the rpm named by
    `packages` (capability -> rpm file name) into the package cache, or says it resolves to no
    package; `rpm -qp --requires` lists `requires` (rpm file name -> lines)."""
    cache = work / "zypper/packages/Basesystem"

    def download(argv: Sequence[str]) -> None:
        name = packages.get(argv[-1])
        if name is not None:
            cache.mkdir(parents=True, exist_ok=True)
            (cache / name).write_bytes(b"rpm")

    runner = FakeRunner()
    runner.on("rpm", output="")
    runner.on("sh", output="")
    runner.on("zypper", output="")
    runner.on(*zypper_prefix(work), "refresh", returncode=refresh_rc,
              output="Repository 'Basesystem' is invalid.\nSignature verification failed for "
              "repomd.xml\n" if refresh_rc else "All repositories have been refreshed.\n")
    for name, lines in (requires or {}).items():
        runner.on(*requires_argv(work, cache / name), output=lines)
    # Last registered, first asked: the capabilities below before this catch-all.
    runner.on(*zypper_prefix(work), "--no-refresh", "download",
              output="Warning: Argument resolves to no package: x\nNothing to do.\n")
    for capability in packages:
        runner.on(*zypper_prefix(work), "--no-refresh", "download", capability, effect=download)
    return runner


def zypper_prefix(work: Path) -> list[str]:
    private = work / "zypper"
    return ["zypper", "--non-interactive", "--root", f"{private}/sysroot",
            "--reposd-dir", f"{private}/repos.d", "--cache-dir", f"{private}/cache",
            "--pkg-cache-dir", f"{private}/packages", "--releasever", "15.6"]


def requires_argv(work: Path, rpm: Path) -> list[str]:
    return ["rpm", "--dbpath", f"{work}/zypper/sysroot/var/lib/rpm", "-qp", "--nosignature",
            "--nodigest", "--requires", str(rpm)]


def facts(arch: str = "x86_64") -> Facts:
    return Facts(Distro("sles", "15.6", 15, "suse", SLES.pretty_name), KERNEL, arch)


DEVEL_RPM = "kernel-default-devel-6.4.0-150600.23.25.1.x86_64.rpm"
NOARCH_RPM = "kernel-devel-6.4.0-150600.23.25.1.noarch.rpm"
MACROS_RPM = "kernel-macros-6.4.0-150600.23.25.1.noarch.rpm"


def test_the_fetch_runs_zypper_on_a_private_root_trusting_the_hosts_keys(tmp_path: Path) -> None:
    root, work = tmp_path / "host", tmp_path / "work"
    posed_host(root)
    before = host_listing(root)
    runner = fetching_runner(
        work, {PACKAGE: DEVEL_RPM, "kernel-devel = 6.4.0-150600.23.25": NOARCH_RPM,
               "kernel-macros": MACROS_RPM},
        requires={DEVEL_RPM: "kernel-devel = 6.4.0-150600.23.25\nrpmlib(PayloadIsZstd) <= 5.4.18-1"
                  "\nwarning: Header V4 RSA/SHA256 Signature, key ID 39db7c82: NOKEY\n",
                  NOARCH_RPM: "kernel-macros\n/bin/sh\n"})
    fetched = suse().fetch_headers(HostRoot(root), from_env({}), facts(), work, runner, PACKAGE,
                                   "the host's repos")
    assert fetched == [PACKAGE, "kernel-devel = 6.4.0-150600.23.25", "kernel-macros"]
    sysroot, cache = work / "zypper/sysroot", work / "zypper/packages/Basesystem"
    private = zypper_prefix(work)
    assert [c.argv for c in runner.calls] == [
        ["rpm", "--root", str(sysroot), "--dbpath", "/var/lib/rpm", "--import",
         str(root / "usr/lib/rpm/gnupg/keys/gpg-pubkey-39db7c82-5f68629b.asc")],
        ["rpm", "--root", str(sysroot), "--dbpath", "/var/lib/rpm", "--import",
         str(root / "etc/pki/repo.key")],
        [*private, "refresh"],
        [*private, "--no-refresh", "download", PACKAGE],
        requires_argv(work, cache / DEVEL_RPM),
        [*private, "--no-refresh", "download", "kernel-devel = 6.4.0-150600.23.25"],
        requires_argv(work, cache / NOARCH_RPM),
        [*private, "--no-refresh", "download", "kernel-macros"],
        requires_argv(work, cache / MACROS_RPM),
        *[["sh", "-c", 'cd "$2" && rpm2cpio "$1" > .payload.cpio && '
           'cpio -idm --quiet --no-absolute-filenames < .payload.cpio; rc=$?; '
           'rm -f .payload.cpio; exit $rc', "sh", str(cache / name), str(work / "root")]
          for name in (DEVEL_RPM, NOARCH_RPM, MACROS_RPM)],
    ]
    zypper_env = {"ZYPP_CONF": f"{work}/zypper/zypp.conf",
                  "ZYPP_LOGFILE": f"{work}/zypper/zypper.log"}
    assert all(c.env == zypper_env for c in runner.calls if c.argv[0] == "zypper")
    assert (work / "zypper/zypp.conf").read_text() == "[main]\narch = x86_64\n"
    assert (work / "zypper/repos.d/basesystem.repo").read_text() == BASESYSTEM
    assert (sysroot / "var/lib/rpm").is_dir()
    assert os.readlink(sysroot / "etc/zypp/credentials.d") == str(
        root / "etc/zypp/credentials.d")
    assert os.readlink(sysroot / "etc/zypp/vars.d") == str(root / "etc/zypp/vars.d")
    assert not any("--gpg-auto-import-keys" in c.argv or "--no-gpg-checks" in c.argv
                   for c in runner.calls)
    assert host_listing(root) == before


def test_a_mirror_replaces_each_repos_url_and_arm64_is_asked_for(tmp_path: Path) -> None:
    root, work = tmp_path / "host", tmp_path / "work"
    posed_host(root)
    runner = fetching_runner(work, {PACKAGE: DEVEL_RPM})
    config = from_env({"NVIDIA_INSTALLER_HEADERS_MIRROR": "http://mirror.example/suse/"})
    suse().fetch_headers(HostRoot(root), config, facts("aarch64"), work, runner, PACKAGE, "m")
    text = (work / "zypper/repos.d/basesystem.repo").read_text()
    assert "baseurl = http://mirror.example/suse/Basesystem/" in text
    assert "updates.example" not in text
    assert (work / "zypper/zypp.conf").read_text() == "[main]\narch = aarch64\n"


def test_a_package_no_repo_has_is_not_found(tmp_path: Path) -> None:
    root, work = tmp_path / "host", tmp_path / "work"
    posed_host(root)
    runner = fetching_runner(work, {})
    with pytest.raises(PackageNotFound, match="no source has it; tried the host's repos"):
        suse().fetch_headers(HostRoot(root), from_env({}), facts(), work, runner, PACKAGE,
                             "the host's repos")


def test_a_repo_zypper_refused_makes_a_missing_package_a_failed_fetch(tmp_path: Path) -> None:
    """The package may be in the repo whose signature failed: never 'no source has it'."""
    root, work = tmp_path / "host", tmp_path / "work"
    posed_host(root)
    runner = fetching_runner(work, {}, refresh_rc=106)
    with pytest.raises(HeadersFetchFailed) as info:
        suse().fetch_headers(HostRoot(root), from_env({}), facts(), work, runner, PACKAGE,
                             "the host's repos")
    assert "Signature verification failed for repomd.xml" in info.value.message
    assert "/usr/lib/rpm/gnupg/keys" in (info.value.hint or "")


def test_a_needed_package_no_repo_has_fails_the_fetch_naming_it(tmp_path: Path) -> None:
    root, work = tmp_path / "host", tmp_path / "work"
    posed_host(root)
    runner = fetching_runner(work, {PACKAGE: DEVEL_RPM},
                             requires={DEVEL_RPM: "kernel-devel = 6.4.0-150600.23.25\n"})
    with pytest.raises(HeadersFetchFailed,
                       match=f"{PACKAGE} needs kernel-devel = 6.4.0-150600.23.25"):
        suse().fetch_headers(HostRoot(root), from_env({}), facts(), work, runner, PACKAGE, "r")


def test_only_header_packages_are_followed() -> None:
    assert zypper.needed("kernel-devel = 6.4.0-150600.23.25\nkernel-devel-rt = 6.4.0-150600.10.5"
                         "\nkernel-macros\nkernel-default = 6.4.0\nlibelf1\n/bin/sh\n"
                         "rpmlib(CompressedFileNames) <= 3.0.4-1\n") == [
        "kernel-devel = 6.4.0-150600.23.25", "kernel-devel-rt = 6.4.0-150600.10.5",
        "kernel-macros"]
