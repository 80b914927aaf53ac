"""The SUSE family's header fetch for real: the image's zypper on a private root reads a posed SLES
host's repo file and trusts only the key the host trusts (suse-build-key's directory), against an
rpm-md repository on 127.0.0.1 whose repomd.xml is signed as SUSE's are. A repository signed by
another key, or not signed, or serving a package its signed metadata does not describe, is
refused; a kernel no repository has is not found; nothing is written on the host."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from lib.headerrepos import Key, make_key, publish_dnf, sign_repomd, suse_devel_rpms
from lib.hosttrees import write_os_release
from lib.httpfaults import serve_directory

from installer import distros
from installer.config import from_env
from installer.distros import PackageNotFound
from installer.distros.family import Facts
from installer.errors import HeadersFetchFailed
from installer.headers import trees
from installer.host import Distro
from installer.hostroot import HostRoot
from installer.runner import SubprocessRunner

_TOOLS = ("zypper", "rpm", "rpmbuild", "createrepo_c", "gpg", "rpm2cpio", "cpio")
_MISSING = [t for t in _TOOLS if shutil.which(t) is None]
pytestmark = pytest.mark.skipif(
    bool(_MISSING), reason=f"needs {', '.join(_MISSING)} (scripts/install-deps installs them; "
    "zypper beside dnf-plugins-core, which Debian's zypper package Breaks)")

KERNEL = "6.4.0-150600.23.25-default"
PACKAGE = "kernel-default-devel-6.4.0-150600.23.25"
SOURCE = "/usr/src/linux-6.4.0-150600.23.25"
OBJ = "/usr/src/linux-6.4.0-150600.23.25-obj/x86_64/default"
WHERE = "the host's package sources (/etc/zypp/repos.d/basesystem.repo)"


class Archive(NamedTuple):
    rpms: list[Path]
    trusted: Key  # the key the host trusts
    other: Key  # a key it does not


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Archive:
    base = tmp_path_factory.mktemp("suse-archive")
    return Archive(suse_devel_rpms(base / "build", KERNEL), make_key(base / "trusted"),
                   make_key(base / "other"))


@pytest.fixture()
def www(tmp_path: Path) -> Iterator[tuple[Path, str, list[str]]]:
    directory = tmp_path / "www"
    directory.mkdir()
    with serve_directory(directory) as (base, requests):
        yield directory, base, requests


def posed_sles(root: Path, base: str, trusted: Key) -> None:
    """A SLES 15 SP6 root: os-release, one repo file pointing at `base` (signature checks left at
    zypper's default, on) and the trusted key where suse-build-key puts SUSE's."""
    write_os_release(root, "sles", "15.6", pretty_name="SUSE Linux Enterprise Server 15 SP6")
    repos = root / "etc/zypp/repos.d"
    repos.mkdir(parents=True)
    (repos / "basesystem.repo").write_text(
        f"[basesystem]\nname=SLE-Module-Basesystem15-SP6-Updates\nenabled=1\nautorefresh=1\n"
        f"baseurl={base}/\ntype=rpm-md\n")
    keys = root / "usr/lib/rpm/gnupg/keys"
    keys.mkdir(parents=True)
    shutil.copy2(trusted.armored, keys / "gpg-pubkey-test.asc")


def listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def fetch(root: Path, work: Path) -> list[str]:
    distro = Distro("sles", "15.6", 15, "suse", "SUSE Linux Enterprise Server 15 SP6")
    return distros.named("suse").fetch_headers(
        HostRoot(root), from_env({}), Facts(distro, KERNEL, "x86_64"), work, SubprocessRunner(),
        PACKAGE, WHERE)


def test_a_repo_signed_by_a_key_the_host_does_not_trust_is_refused(
        archive: Archive, www: tuple[Path, str, list[str]], tmp_path: Path) -> None:
    """The attack first: the repository offers its own key beside the signature; zypper,
    non-interactive, rejects it and nothing is fetched."""
    directory, base, requests = www
    publish_dnf(directory, archive.rpms)
    sign_repomd(directory, archive.other, offer_key=True)
    root, work = tmp_path / "host", tmp_path / "work"
    posed_sles(root, base, archive.trusted)
    before = listing(root)
    with pytest.raises(HeadersFetchFailed) as info:
        fetch(root, work)
    assert "Signature verification failed for repomd.xml" in info.value.message
    assert f"{PACKAGE} is in none of the repositories zypper could read" in info.value.message
    assert not any(r.endswith(".rpm") for r in requests), requests
    assert not (work / "root").exists()
    assert listing(root) == before


def test_an_unsigned_repo_is_refused(archive: Archive, www: tuple[Path, str, list[str]],
                                     tmp_path: Path) -> None:
    directory, base, requests = www
    publish_dnf(directory, archive.rpms)
    root, work = tmp_path / "host", tmp_path / "work"
    posed_sles(root, base, archive.trusted)
    with pytest.raises(HeadersFetchFailed, match="could not read every one of"):
        fetch(root, work)
    assert not any(r.endswith(".rpm") for r in requests), requests
    assert not (work / "root").exists()


def test_a_package_its_signed_metadata_does_not_describe_is_refused(
        archive: Archive, www: tuple[Path, str, list[str]], tmp_path: Path) -> None:
    """The metadata is signed and trusted, the rpm served is not the one it describes."""
    directory, base, _ = www
    publish_dnf(directory, archive.rpms)
    sign_repomd(directory, archive.trusted)
    served = directory / archive.rpms[-1].name
    data = bytearray(served.read_bytes())
    data[-200] ^= 0xFF
    served.write_bytes(bytes(data))
    root, work = tmp_path / "host", tmp_path / "work"
    posed_sles(root, base, archive.trusted)
    with pytest.raises(HeadersFetchFailed, match=f"could not download {PACKAGE}"):
        fetch(root, work)
    assert not (work / "root").exists()


def test_the_fetch_unpacks_both_trees_and_writes_only_under_work(
        archive: Archive, www: tuple[Path, str, list[str]], tmp_path: Path) -> None:
    directory, base, requests = www
    publish_dnf(directory, archive.rpms)
    sign_repomd(directory, archive.trusted)
    root, work = tmp_path / "host", tmp_path / "work"
    posed_sles(root, base, archive.trusted)
    before = listing(root)
    assert fetch(root, work) == [PACKAGE, "kernel-devel = 6.4.0-150600.23.25"]
    assert sorted(r.rsplit("/", 1)[-1] for r in requests if r.endswith(".rpm")) == sorted(
        rpm.name for rpm in archive.rpms)
    headers = trees.find_unpacked_headers(work / "root", KERNEL)
    assert headers is not None
    assert (str(headers.output_path), str(headers.source_path)) == (OBJ, SOURCE)
    assert (work / f"root{OBJ}/.config").read_text() == "CONFIG_GCC_VERSION=70500\n"
    assert (work / "zypper/zypper.log").is_file()
    assert listing(root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host", "work", "www"]


def test_a_kernel_no_repo_has_is_not_found(archive: Archive,
                                           www: tuple[Path, str, list[str]],
                                           tmp_path: Path) -> None:
    directory, base, _ = www
    publish_dnf(directory, archive.rpms[:1])  # kernel-devel only: no flavour's package
    sign_repomd(directory, archive.trusted)
    root, work = tmp_path / "host", tmp_path / "work"
    posed_sles(root, base, archive.trusted)
    with pytest.raises(PackageNotFound, match=re.escape(f"no source has it; tried {WHERE};")):
        fetch(root, work)
