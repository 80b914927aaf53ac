"""The hosts GPU fleets run in 2026, shaped like the real ones: small kernel header trees packaged
as Ubuntu and the EL rebuilds package them, the repo files each distribution installs, and the
os-release and /proc files of each. Where each shape comes from is said beside it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lib.headerrepos import (
    Key,
    deb822_ubuntu_sources,
    rocky_repos,
    signed_devel_rpm,
    ubuntu_header_pair,
)
from lib.hostreleases import HostRelease, PosedHost
from lib.hosttrees import (
    header_tree,
    write_known_os_release,
    write_os_release,
    write_osrelease_kernel,
)

DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def pose_host(root: Path, distro: str, kernel: str, arch: str, proc_version: str) -> Path:
    """A node of `distro` running `kernel` on `arch`: os-release, then pose_kernel."""
    write_known_os_release(root, distro)
    return pose_kernel(root, kernel, arch, proc_version)


def pose_release(root: Path, host: PosedHost) -> Path:
    """A node of a posed host's release (its os-release from data) running the host's kernel."""
    write_release_os_release(root, host.release)
    return pose_kernel(root, host.kernel.release, host.kernel.arch, host.kernel.proc_version)


def write_release_os_release(root: Path, release: HostRelease) -> Path:
    return write_os_release(root, release.id, release.version_id,
                            pretty_name=release.pretty_name or None, codename=release.codename)


def pose_kernel(root: Path, kernel: str, arch: str, proc_version: str) -> Path:
    """A node running `kernel` on `arch`: the kernel's release and machine (kernel.osrelease and
    kernel.arch under /proc/sys), /proc/version, no module loaded, its /lib/modules dir."""
    write_osrelease_kernel(root, kernel)
    (root / "proc/sys/kernel/arch").write_text(f"{arch}\n")
    (root / "proc/version").write_text(proc_version)
    (root / "proc/modules").write_text("")
    (root / "lib/modules" / kernel).mkdir(parents=True, exist_ok=True)
    return root


# --- Ubuntu ------------------------------------------------------------------------------
# packages.ubuntu.com (noble, and resolute alike): `linux-headers-<release>` (one per flavour:
# -generic, -generic-64k, -nvidia, -nvidia-64k, -aws, -azure, -gcp, HWE's -generic) holds
# /usr/src/linux-headers-<release> (the flavour's config and generated files, the rest linked
# into the common tree) and /lib/modules/<release>/build, and Depends on its source's common
# package: `linux-headers-<abi>` for the main kernel, `linux-<source>-headers-<abi>` for the
# others (linux-aws-headers-6.8.0-1008, linux-nvidia-headers-..., linux-hwe-6.14-headers-...),
# Architecture: all, holding /usr/src/<that package>. ../shared/reference/blackwell-grace.md §5
# for the -nvidia-64k and -generic-64k names.


def ubuntu_debs(work: Path, kernel: str, common: str, arch: str, gcc: int,
                page_kib: int | None = None) -> list[Path]:
    abi = kernel.rsplit("-", 1)[0] if not kernel.endswith("-64k") else kernel.rsplit("-", 2)[0]
    version = f"{abi}.1"
    base = work / f"{kernel}-common"
    common_dir = base / "usr/src" / common
    (common_dir / "include/linux").mkdir(parents=True)
    (common_dir / "Makefile").write_text("# the kernel's top Makefile\n")
    (common_dir / "include/linux/kernel.h").write_text("/* kernel.h */\n")
    flavour = work / f"{kernel}-flavour"
    tree = flavour / "usr/src" / f"linux-headers-{kernel}"
    header_tree(tree, kernel, gcc, page_kib)
    for name in ("Makefile", "include/linux/kernel.h"):
        (tree / name).unlink()
    os.rmdir(tree / "include/linux")
    os.symlink(f"../{common}/Makefile", tree / "Makefile")
    os.symlink(f"../../{common}/include/linux", tree / "include/linux")
    return ubuntu_header_pair(work / "debs", base, flavour, kernel, common, version,
                              DEB_ARCH[arch], "libelf1t64",
                              "Linux kernel headers (test archive, Ubuntu's shape)")


def ubuntu_sources(root: Path, base: str, suite: str, key: Key, arch: str) -> None:
    """24.04 and later write deb822 `ubuntu.sources` with Signed-By the archive keyring
    (archive.ubuntu.com for amd64, ports.ubuntu.com/ubuntu-ports for arm64)."""
    uri = f"{base}/ubuntu" if arch == "x86_64" else f"{base}/ubuntu-ports"
    deb822_ubuntu_sources(root, key, "ubuntu-archive-keyring.gpg",
                          f"Types: deb\nURIs: {uri}\n"
                          f"Suites: {suite} {suite}-updates {suite}-backports\n"
                          "Components: main restricted universe multiverse\n")


# --- the EL rebuilds and Amazon Linux ------------------------------------------------------


def el_devel_rpm(work: Path, name: str, kernel: str, arch: str, key: Key, gcc: int,
                 page_kib: int | None = None) -> Path:
    """`name` (kernel-devel, kernel-uek-devel, kernel-64k-devel, kernel6.12-devel) of `kernel`
    as the EL rebuilds and Amazon Linux ship it: one tree in /usr/src/kernels/<uname -r>, the
    package's version-release the release without its arch (and without +64k: RHEL's
    kernel-64k-devel has the 4k kernel's NVR), signed with `key`."""
    tree = work / f"{name}-tree" / "usr/src/kernels" / kernel
    header_tree(tree, kernel, gcc, page_kib)
    return signed_devel_rpm(work / f"{name}-{kernel}.spec", work / f"rpmbuild-{name}-{kernel}",
                            name, kernel, tree, key, arch)


def _repo_file(root: Path, file: str, key_file: str, key: Key,
               repos: dict[str, tuple[str, str]]) -> None:
    pki = root / "etc/pki/rpm-gpg"
    pki.mkdir(parents=True, exist_ok=True)
    shutil.copy2(key.armored, pki / key_file)
    lines = []
    for repo_id, (title, url) in repos.items():
        lines += [f"[{repo_id}]", f"name={title}", f"baseurl={url}",
                  f"gpgkey=file:///etc/pki/rpm-gpg/{key_file}", "gpgcheck=1", "enabled=1", ""]
    (root / "etc/yum.repos.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/yum.repos.d" / file).write_text("\n".join(lines))


def oracle_repos(root: Path, major: int, base: str, key: Key) -> None:
    """oraclelinux-release-el<N>'s files: `oracle-linux-ol<N>.repo` (BaseOS latest,
    AppStream: RHCK's kernel-devel) and `uek-ol<N>.repo` (the UEK channel: kernel-uek-devel),
    signed by RPM-GPG-KEY-oracle. Real baseurls are https://yum$ociregion.$ocidomain/repo/
    OracleLinux/OL<N>/...; here the same paths on the test server."""
    repo = f"{base}/repo/OracleLinux/OL{major}"
    uek = {8: "UEKR7", 9: "UEKR8", 10: "UEKR8"}[major]
    _repo_file(root, f"oracle-linux-ol{major}.repo", "RPM-GPG-KEY-oracle", key, {
        f"ol{major}_baseos_latest": (f"Oracle Linux {major} BaseOS Latest ($basearch)",
                                     f"{repo}/baseos/latest/$basearch/"),
        f"ol{major}_appstream": (f"Oracle Linux {major} Application Stream ($basearch)",
                                 f"{repo}/appstream/$basearch/"),
    })
    _repo_file(root, f"uek-ol{major}.repo", "RPM-GPG-KEY-oracle", key, {
        f"ol{major}_{uek}": (f"Latest Unbreakable Enterprise Kernel for Oracle Linux {major}",
                             f"{repo}/{uek}/$basearch/"),
    })


def amazon_repos(root: Path, base: str, key: Key) -> None:
    """AL2023's `amazonlinux.repo` and its releasever lock: /etc/dnf/vars/releasever says
    `latest` (deterministic upgrades); the real repo reaches cdn.amazonlinux.com through a
    mirrorlist under al2023/core/mirrors/$releasever/$basearch, here a baseurl of that path."""
    _repo_file(root, "amazonlinux.repo", "RPM-GPG-KEY-amazon-linux-2023", key, {
        "amazonlinux": ("Amazon Linux 2023 repository",
                        f"{base}/al2023/core/$releasever/$basearch/"),
    })
    (root / "etc/dnf/vars").mkdir(parents=True, exist_ok=True)
    (root / "etc/dnf/vars/releasever").write_text("latest\n")


def rhel_repos(root: Path, major: int, arch: str, base: str, key: Key) -> None:
    """redhat.repo as subscription-manager writes it: AppStream per arch
    (rhel-<N>-for-<arch>-appstream-rpms), signed by RPM-GPG-KEY-redhat-release."""
    _repo_file(root, "redhat.repo", "RPM-GPG-KEY-redhat-release", key, {
        f"rhel-{major}-for-{arch}-appstream-rpms": (
            f"Red Hat Enterprise Linux {major} for $basearch - AppStream (RPMs)",
            f"{base}/content/dist/rhel{major}/$releasever/$basearch/appstream/os"),
    })


def release_sources(root: Path, release: HostRelease, arch: str, base: str, key: Key) -> None:
    """The package sources (and signing key) the release's family installs, on `base`."""
    major = int(release.version_id.split(".")[0])
    if release.id == "ubuntu":
        ubuntu_sources(root, base, release.codename, key, arch)
    elif release.id == "ol":
        oracle_repos(root, major, base, key)
    elif release.id == "amzn":
        amazon_repos(root, base, key)
    elif release.id == "rhel":
        rhel_repos(root, major, arch, base, key)
    elif release.id == "rocky":
        rocky_repos(root, major, base, key, {"baseos": f"rocky/{major}/BaseOS/$basearch/os/",
                                             "appstream": f"rocky/{major}/AppStream/$basearch/os/"})
    else:
        raise ValueError(f"no package sources are shaped for {release.name}")
