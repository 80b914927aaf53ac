"""The hosts of 2026 (Ubuntu 24.04 and 26.04 in every flavour fleets use, Oracle Linux 8-10 with
UEK and RHCK, Amazon Linux 2023 on both kernel lines, RHEL's +64k kernels, Rocky 10): for each,
`installer plan` on a posed root states the source, the headers package, the compiler, the image
tag, the architecture, the flavour and the page size; then the family's own code fetches the
headers with real apt-get or dnf from signed repos on 127.0.0.1 shaped like the distribution's,
and plan reads the fetched headers' config. Unsupported releases and a 590 driver on a 64k-page
kernel are refused before anything changes."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from lib.headerrepos import make_key, publish_apt, publish_dnf, rocky_repos
from lib.hostkit import INSTALL_DIR_HOST, installer_env, run_installer
from lib.hostshapes import (
    amazon_repos,
    el_devel_rpm,
    oracle_repos,
    pose_host,
    rhel_repos,
    ubuntu_debs,
    ubuntu_sources,
)
from lib.httpfaults import serve_directory

from installer import app
from installer.config import from_env
from installer.headers import fetch
from installer.host import gather
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.runner import SubprocessRunner

_TOOLS = ("apt-get", "dpkg-deb", "dpkg-scanpackages", "gpg", "dnf", "rpmbuild", "rpmsign",
          "createrepo_c", "rpm2cpio", "cpio", "unshare")
_MISSING = [t for t in _TOOLS if shutil.which(t) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING) and not os.environ.get("CI"),
                                reason=f"needs {', '.join(_MISSING)}")

VERSION = "580.105.08"
# Ubuntu 26.04 and kernel 7.0 take 595.91.07 or newer (the floors of installer/release/data/
# floors.json): NVIDIA publishes no R580 for 26.04, and 580's modules do not build on 7.0.
RESOLUTE_VERSION = "595.91.07"


def version_of(host: Host) -> str:
    return RESOLUTE_VERSION if host.distro == "ubuntu-26.04" else VERSION
UNREACHABLE = "http://127.0.0.1:9"


def ubuntu_gcc(kernel: str, gcc: str, build: str) -> str:
    """/proc/version as Ubuntu's kernels write it (the compiler named by its triplet)."""
    arch, major = "aarch64" if "64k" in kernel else "x86_64", gcc.split(".")[0]
    return (f"Linux version {kernel} (buildd@bos03-{arch}) ({arch}-linux-gnu-gcc-{major}"
            f" (Ubuntu {gcc}) {gcc}, GNU ld (GNU Binutils for Ubuntu) 2.42) #{build}-Ubuntu SMP\n")


def el_gcc(kernel: str, gcc: str) -> str:
    return (f"Linux version {kernel} (mockbuild@build) (gcc (GCC) {gcc} (Red Hat {gcc}-1), "
            "GNU ld version 2.41) #1 SMP PREEMPT_DYNAMIC\n")


class Host(NamedTuple):
    distro: str
    kernel: str
    arch: str
    package: str  # the headers package the installer must name and fetch
    common: str  # Ubuntu: the common package it depends on; EL: ""
    gcc: int  # the kernel's gcc major (/proc/version and the headers' config)
    proc_version: str
    tag: str  # the installer image tag for the host's release
    page_kib: int | None = None  # the headers' CONFIG_ARM64_*K_PAGES (arm64 only)

    @property
    def package_name(self) -> str:
        """The package's name without its version (kernel-64k-devel's is the 4k release)."""
        return self.package.split(f"-{self.kernel.removesuffix('+64k')}")[0]


def ubuntu_host(distro: str, kernel: str, common: str, gcc: str, build: str,
                page_kib: int | None = None) -> Host:
    """An Ubuntu host: linux-headers-<kernel> depending on `common`, built with `gcc` (as
    ubuntu_gcc, its arch from a -64k flavour), the image tag the release's."""
    return Host(distro, kernel, "aarch64" if "64k" in kernel else "x86_64",
                f"linux-headers-{kernel}", common, int(gcc.split(".")[0]),
                ubuntu_gcc(kernel, gcc, build), distro.replace("-", ""), page_kib)


def el_host(distro: str, kernel: str, devel: str, gcc: str, tag: str,
            page_kib: int | None = None) -> Host:
    """An EL-family host: the arch is the uname's last part, the headers `devel`-<NVR> (the 4k
    NVR for a +64k kernel), built with the system `gcc`."""
    nvr = kernel.removesuffix("+64k")
    return Host(distro, kernel, nvr.rsplit(".", 1)[1], f"{devel}-{nvr}", "",
                int(gcc.split(".")[0]), el_gcc(kernel, gcc), tag, page_kib)


# Ubuntu 24.04: every kernel is built with noble's gcc-13, its HWE backports too
# (/proc/version of 6.17.0-1011-azure #11~24.04.2-Ubuntu: "gcc (Ubuntu 13.3.0) 13.3.0").
# Ubuntu 26.04 (resolute) builds with its default gcc-15 (its toolchain: GCC 15, glibc 2.41 -
# webpronews.com on 26.04's snapshots; GB300's recipe runs its 7.0 -nvidia-64k kernel).
NOBLE_GCC, RESOLUTE_GCC = "13.3.0", "15.2.0"
HOSTS = {
    "noble-generic": ubuntu_host("ubuntu-24.04", "6.8.0-87-generic", "linux-headers-6.8.0-87",
                                 NOBLE_GCC, "87"),
    "noble-hwe": ubuntu_host("ubuntu-24.04", "6.14.0-33-generic",
                             "linux-hwe-6.14-headers-6.14.0-33", NOBLE_GCC, "33~24.04.1"),
    "noble-aws": ubuntu_host("ubuntu-24.04", "6.8.0-1040-aws", "linux-aws-headers-6.8.0-1040",
                             NOBLE_GCC, "42"),
    "noble-azure": ubuntu_host("ubuntu-24.04", "6.17.0-1011-azure",
                               "linux-azure-6.17-headers-6.17.0-1011", NOBLE_GCC, "11~24.04.2"),
    "noble-gcp": ubuntu_host("ubuntu-24.04", "6.8.0-1039-gcp", "linux-gcp-headers-6.8.0-1039",
                             NOBLE_GCC, "41"),
    "noble-nvidia": ubuntu_host("ubuntu-24.04", "6.8.0-1036-nvidia",
                                "linux-nvidia-headers-6.8.0-1036", NOBLE_GCC, "39"),
    "noble-nvidia-64k": ubuntu_host("ubuntu-24.04", "6.8.0-1036-nvidia-64k",
                                    "linux-nvidia-headers-6.8.0-1036", NOBLE_GCC, "39",
                                    page_kib=64),
    "noble-generic-64k": ubuntu_host("ubuntu-24.04", "6.8.0-87-generic-64k",
                                     "linux-headers-6.8.0-87", NOBLE_GCC, "87", page_kib=64),
    "resolute-generic": ubuntu_host("ubuntu-26.04", "7.0.0-15-generic", "linux-headers-7.0.0-15",
                                    RESOLUTE_GCC, "15"),
    "resolute-nvidia-64k": ubuntu_host("ubuntu-26.04", "7.0.0-1004-nvidia-64k",
                                       "linux-nvidia-headers-7.0.0-1004", RESOLUTE_GCC, "4",
                                       page_kib=64),
    # Oracle Linux: UEK's uname ends .el<N>uek.<arch> (6.12.0-105.51.5.el9uek.x86_64 beside
    # RHCK's 5.14.0-570.60.1.0.1.el9_6: mondoohq/mql PR #6380); kernel-uek-devel for UEK,
    # kernel-devel for RHCK. The gcc of each is as posed here (EL's system gcc).
    "ol8-uek": el_host("ol-8", "5.15.0-312.187.5.el8uek.x86_64", "kernel-uek-devel", "11.4.1",
                       "rocky8"),
    "ol9-uek": el_host("ol-9", "6.12.0-105.51.5.el9uek.x86_64", "kernel-uek-devel", "11.5.0",
                       "rocky9"),
    "ol9-rhck": el_host("ol-9", "5.14.0-570.60.1.0.1.el9_6.x86_64", "kernel-devel", "11.5.0",
                        "rocky9"),
    "ol10-rhck": el_host("ol-10", "6.12.0-55.9.1.0.1.el10_0.x86_64", "kernel-devel", "14.2.1",
                         "rocky10"),
    # Amazon Linux 2023: the 6.1 line is `kernel` (kernel-devel), later lines are their own
    # packages (kernel6.12-devel); 6.1 is built with AL2023's gcc 11 ("gcc (GCC) 11.5.0 20240719
    # (Red Hat 11.5.0-5)" in its /proc/version).
    "al2023-6.1": el_host("amzn-2023", "6.1.147-172.266.amzn2023.x86_64", "kernel-devel", "11.5.0",
                          "rocky9"),
    "al2023-6.12": el_host("amzn-2023", "6.12.40-63.114.amzn2023.aarch64", "kernel6.12-devel",
                           "11.5.0", "rocky9", page_kib=4),
    # RHEL's 64k kernel: uname `...el9_N.aarch64+64k`, kernel-64k-devel of the 4k NVR
    # (../shared/reference/blackwell-grace.md §5).
    "rhel9-64k": el_host("rhel-9", "5.14.0-503.15.1.el9_5.aarch64+64k", "kernel-64k-devel",
                         "11.5.0", "rocky9", page_kib=64),
    "rhel10-64k": el_host("rhel-10", "6.12.0-55.9.1.el10_0.aarch64+64k", "kernel-64k-devel",
                          "14.2.1", "rocky10", page_kib=64),
    "rocky10": el_host("rocky-10", "6.12.0-55.12.1.el10_0.x86_64", "kernel-devel", "14.2.1",
                       "rocky10"),
}
SUITES = {"ubuntu-24.04": "noble", "ubuntu-26.04": "resolute"}
# The flavour plan names on the EL hosts (Ubuntu's: the release after its ABI number).
FLAVOURS = {"ol8-uek": "uek", "ol9-uek": "uek", "ol9-rhck": "default", "ol10-rhck": "default",
            "al2023-6.1": "kernel", "al2023-6.12": "kernel6.12", "rhel9-64k": "64k",
            "rhel10-64k": "64k", "rocky10": "default"}


def el_repo_dir(host: Host) -> str:
    """Where the host's repo files (lib.hostshapes) find the devel package on the server."""
    arch = host.arch
    if host.distro.startswith("ol-"):
        major = int(host.distro.split("-")[1])
        channel = ({8: "UEKR7", 9: "UEKR8", 10: "UEKR8"}[major] if "uek" in host.package
                   else "appstream")
        return f"repo/OracleLinux/OL{major}/{channel}/{arch}"
    if host.distro == "amzn-2023":
        return f"al2023/core/latest/{arch}"
    if host.distro.startswith("rhel-"):
        major = host.distro.split("-")[1]
        return f"content/dist/rhel{major}/{major}/{arch}/appstream/os"
    return f"rocky/10/AppStream/{arch}/os"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, list[str]]]:
    """One server with every distribution's repos: Ubuntu's (per suite and architecture, on
    archive.ubuntu.com's and ports.ubuntu.com's paths) and the EL rebuilds' and Amazon's."""
    work = tmp_path_factory.mktemp("host-releases")
    www = work / "www"
    key = make_key(work / "key")
    debs: dict[tuple[str, str], list[Path]] = {}
    rpms: dict[str, list[Path]] = {}
    for name, host in HOSTS.items():
        if host.common:
            top = "ubuntu" if host.arch == "x86_64" else "ubuntu-ports"
            debs.setdefault((top, SUITES[host.distro]), []).extend(
                ubuntu_debs(work / name, host.kernel, host.common, host.arch, host.gcc,
                            host.page_kib))
        else:
            rpm = el_devel_rpm(work / name, host.package_name, host.kernel, host.arch, key,
                               host.gcc, host.page_kib)
            rpms.setdefault(el_repo_dir(host), []).append(rpm)
    for (top, suite), found in debs.items():
        publish_apt(www / top, suite, found, key, arch="amd64" if top == "ubuntu" else "arm64")
    for where, found in rpms.items():
        publish_dnf(www / where, found)
    # The other repos the hosts' files name, empty (dnf reads each).
    for where in ("repo/OracleLinux/OL8/baseos/latest/x86_64", "repo/OracleLinux/OL8/appstream/"
                  "x86_64", "repo/OracleLinux/OL9/baseos/latest/x86_64",
                  "repo/OracleLinux/OL9/UEKR8/x86_64", "repo/OracleLinux/OL10/baseos/latest/"
                  "x86_64", "repo/OracleLinux/OL10/UEKR8/x86_64",
                  "rocky/10/BaseOS/x86_64/os"):
        if not (www / where / "repodata").is_dir():
            publish_dnf(www / where, [])
    with serve_directory(www) as (base, requests):
        yield base, key, requests


def posed(tmp_path: Path, host: Host, base: str, key: Any) -> Path:
    root = pose_host(tmp_path / "host", host.distro, host.kernel, host.arch, host.proc_version)
    major = int(host.distro.split("-")[1].split(".")[0])
    if host.common:
        ubuntu_sources(root, base, SUITES[host.distro], key, host.arch)
    elif host.distro.startswith("ol-"):
        oracle_repos(root, major, base, key)
    elif host.distro == "amzn-2023":
        amazon_repos(root, base, key)
    elif host.distro.startswith("rhel-"):
        rhel_repos(root, major, host.arch, base, key)
    else:
        rocky_repos(root, major, base, key, {"baseos": "rocky/10/BaseOS/$basearch/os/",
                                             "appstream": "rocky/10/AppStream/$basearch/os/"})
    return root


def env_for(root: Path, host: Host, **settings: str) -> dict[str, str]:
    return installer_env(root, host.kernel, **{
        "NVIDIA_DRIVER_VERSION": version_of(host), "NVIDIA_INSTALLER_FETCH_HEADERS": "true",
        "NVIDIA_INSTALLER_ROCKY_VAULT": UNREACHABLE, **settings})


def planned(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """`installer plan`'s decisions, in this process (the CLI's own path is run below)."""
    plan = app.build_plan(from_env(env), SubprocessRunner())
    return lines("\n".join(app.describe_plan(plan)))


def lines(stdout: str) -> dict[str, tuple[str, str]]:
    """`installer plan`'s decisions: topic -> (value, reason)."""
    found, rows = {}, stdout.splitlines()
    for index, row in enumerate(rows):
        if row.startswith("  ") and not row.startswith("    ") and ": " in row and (
                index + 1 < len(rows) and rows[index + 1].startswith("      because ")):
            topic, _, value = row.strip().partition(": ")
            found[topic] = (value, rows[index + 1].strip().removeprefix("because "))
    return found


@pytest.mark.parametrize("name", list(HOSTS))
def test_plan_names_everything_then_the_family_fetches_the_headers(
        archive: Any, tmp_path: Path, name: str) -> None:
    base, key, requests = archive
    host = HOSTS[name]
    root = posed(tmp_path, host, base, key)
    env = env_for(root, host)
    said = planned(env)
    assert said["source"][0] == "runfile"
    assert said["kernel-headers"][0] == f"fetch {host.package}"
    assert said["headers-package"][0] == host.package
    assert said["image-tag"][0] == host.tag
    assert f"kernel built with gcc {host.gcc} (/proc/version)" in said["image-tag"][1]
    assert said["compiler"][0] == "missing"  # this machine has gcc 12 only
    assert f"gcc-{host.gcc}: use the installer image tag" in said["compiler"][1]
    assert said["architecture"][0] == host.arch
    version = version_of(host)
    assert said["version"][0] == version
    assert f"NVIDIA-Linux-{host.arch}-{version}.run" in said["architecture"][1]
    assert f"/NVIDIA-Linux-{host.arch}-{version}.run" in said["download"][0]
    assert said["kernel-flavour"][0] == FLAVOURS.get(name, host.kernel.split("-", 2)[-1])
    page = said["page-size"]
    if host.arch == "x86_64":
        assert page == ("4 KiB", "from x86_64 kernels have 4 KiB pages only")
    elif host.kernel.endswith("64k"):
        assert page[0] == "64 KiB" and "the kernel's name" in page[1]
    else:
        assert page[0] == "unknown"

    # The run's header fetch, through the family's own code: real apt-get or dnf reading the
    # host's sources (re-rooted), signatures checked, unpacked into the cache.
    requests.clear()
    config = from_env(env)
    host_root = HostRoot(root)
    facts = gather(host_root, kernel_override=host.kernel, free_space_path=root)
    headers = fetch.obtain(host_root, config, facts, Layout.from_config(config, host_root),
                           SubprocessRunner())
    cache = root / INSTALL_DIR_HOST.lstrip("/") / "cache/headers" / host.kernel
    assert headers.unpacked_root == cache / "root"
    fetched = (cache / ".complete").read_text().split()
    assert fetched == ([host.package, host.common] if host.common else [host.package])
    downloaded = [r.rsplit("/", 1)[-1] for r in requests if r.endswith((".deb", ".rpm"))]
    assert any(d.startswith(f"{host.package_name}-") or d.startswith(f"{host.package}_")
               for d in downloaded), downloaded
    for path in ("var/lib/dpkg", "var/lib/apt", "var/lib/rpm", "var/lib/dnf", "var/cache"):
        assert not (root / path).exists(), path

    # On arm64, plan now reads the fetched headers: their config's gcc and page size (once is
    # enough elsewhere: the reading is the family-independent headers code).
    if host.page_kib:
        again = planned(env)
        assert "fetched by an earlier run" in again["kernel-headers"][1]
        assert f"gcc {host.gcc} (the headers' CONFIG_GCC_VERSION)" in again["image-tag"][1]
        assert again["page-size"][0] == f"{host.page_kib} KiB"
        assert "the headers' config" in again["page-size"][1]


def test_an_unsupported_release_is_refused_naming_the_nearest(tmp_path: Path) -> None:
    """Amazon Linux 2 (the others: tests/lib/hosts/unsupported.json, tests/unit/test_distros.py)."""
    distro_id, version_id, nearest = "amzn", "2", "Amazon Linux 2023"
    root = tmp_path / "host"
    pose_host(root, "ubuntu-24.04", "6.8.0-87-generic", "x86_64", "Linux version 6.8.0\n")
    (root / "etc/os-release").write_text(f'ID={distro_id}\nVERSION_ID="{version_id}"\n')
    result = run_installer(env_for(root, HOSTS["noble-generic"]), "plan")
    assert result.returncode == 14, result.stderr[-2000:]
    assert "error[unsupported-distro]" in result.stderr
    assert f"the nearest supported release is {nearest}" in result.stderr
    assert not (root / INSTALL_DIR_HOST.lstrip("/")).exists()


def test_a_590_driver_on_a_64k_kernel_is_refused_unless_accepted(tmp_path: Path) -> None:
    """Grace on Ubuntu 24.04's -nvidia-64k kernel, its config in /boot: 580 is planned as fine;
    590.48.01 is refused before anything changes (open-gpu-kernel-modules #1269), unless the
    operator accepts the risk. (Ubuntu 26.04's 7.0 kernels take 595.91.07 or newer: a floor.)"""
    host = HOSTS["noble-nvidia-64k"]
    root = pose_host(tmp_path / "host", host.distro, host.kernel, host.arch, host.proc_version)
    (root / "boot").mkdir()
    (root / "boot" / f"config-{host.kernel}").write_text(
        "CONFIG_ARM64=y\n# CONFIG_ARM64_4K_PAGES is not set\nCONFIG_ARM64_64K_PAGES=y\n"
        "CONFIG_ARM64_PAGE_SHIFT=16\n")
    fine = lines(run_installer(env_for(root, host), "plan").stdout)
    assert fine["page-size"][0] == "64 KiB"
    assert f"/boot/config-{host.kernel}" in fine["page-size"][1]
    assert "predates the 64k-page faults of open-gpu-kernel-modules #1269" in (
        fine["page-size"][1])
    env = env_for(root, host, NVIDIA_DRIVER_VERSION="590.48.01",
                  NVIDIA_INSTALLER_ALLOW_NO_GPU="true")
    warned = lines(run_installer(env, "plan").stdout)["page-size"]
    assert "warning: driver 590.48.01 on a 64k-page kernel" in warned[1]
    assert "Xid 31" in warned[1] and "open-gpu-kernel-modules #1269" in warned[1]
    assert "`run` refuses (driver-64k-page-risk)" in warned[1]
    refused = run_installer(env, "run")
    assert refused.returncode == 78, refused.stderr[-2000:]
    assert "error[driver-64k-page-risk]" in refused.stderr
    assert "NVIDIA_INSTALLER_ALLOW_64K_PAGE_RISK=true" in refused.stderr
    assert not (root / INSTALL_DIR_HOST.lstrip("/")).exists()
    accepting = {**env, "NVIDIA_INSTALLER_ALLOW_64K_PAGE_RISK": "true"}
    accepted = lines(run_installer(accepting, "plan").stdout)
    assert "installs anyway (NVIDIA_INSTALLER_ALLOW_64K_PAGE_RISK=true)" in (
        accepted["page-size"][1])
    # Past the refusal, with a warning: the run goes on to the next check (this machine has no
    # gcc-13 for the kernel: compiler-missing, still before any download).
    went_on = run_installer(accepting, "run")
    assert went_on.returncode == 43, went_on.stderr[-2000:]
    assert "installing anyway (NVIDIA_INSTALLER_ALLOW_64K_PAGE_RISK=true)" in went_on.stderr


def test_verify_json_reports_the_hosts_architecture(tmp_path: Path) -> None:
    """A Grace node (kernel.arch aarch64 under the host root) before any driver: the report
    says which architecture it checked, beside what is missing."""
    host = HOSTS["rhel9-64k"]
    root = pose_host(tmp_path / "host", host.distro, host.kernel, host.arch, host.proc_version)
    result = run_installer(env_for(root, host), "verify", "--json")
    assert result.returncode == 40, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert document["architecture"] == "aarch64"
    assert document["ok"] is False and document["problems"]


def test_a_2604_node_in_another_image_stops_before_any_download(archive: Any,
                                                                tmp_path: Path) -> None:
    """`installer run` on Ubuntu 26.04 from an image without gcc-15 (this machine's gcc 12):
    the kernel's compiler is known from /proc/version, so the run stops at check-compiler
    naming the ubuntu26.04 image, before fetching headers or the driver."""
    base, key, requests = archive
    host = HOSTS["resolute-generic"]
    root = posed(tmp_path, host, base, key)
    requests.clear()
    result = run_installer(env_for(root, host, NVIDIA_DRIVER_MIRRORS=f"{base}/runfiles",
                                   NVIDIA_INSTALLER_ALLOW_NO_GPU="true"), "run")
    assert result.returncode == 43, result.stderr[-3000:]
    assert "error[compiler-missing]" in result.stderr
    assert "Compiler gcc-15: use the installer image tag ubuntu26.04" in result.stderr
    assert requests == []


def test_ubuntu_26_04_on_7_0_refuses_r580_before_any_download_and_auto_takes_595(
        tmp_path: Path) -> None:
    """NVIDIA publishes no R580 for Ubuntu 26.04 and 580's modules do not build on 7.0: `plan`
    and `run` stop with the floor's own error before anything is fetched (the download and
    mirror point at a closed port), and `auto` picks the newest release that builds there."""
    kernel = "7.0.0-14-generic"
    host = HOSTS["resolute-generic"]._replace(
        kernel=kernel, proc_version=ubuntu_gcc(kernel, RESOLUTE_GCC, "14"))
    root = pose_host(tmp_path / "host", host.distro, host.kernel, host.arch, host.proc_version)
    env = env_for(root, host, NVIDIA_DRIVER_VERSION="R580", NVIDIA_DRIVER_MIRRORS=UNREACHABLE,
                  NVIDIA_INSTALLER_ALLOW_NO_GPU="true")
    for command in ("plan", "run"):
        refused = run_installer(env, command)
        assert refused.returncode == 79, refused.stderr[-2000:]
        assert ("error[driver-below-floor]: 'R580' (R580) is below this host's floor: "
                "kernel-7.0: R595 or newer") in refused.stderr
        assert "ubuntu-26.04: R595 or newer" in refused.stderr
        assert "the newest release in the catalog that meets them: 595.91.07" in refused.stderr
        assert not (root / INSTALL_DIR_HOST.lstrip("/")).exists()
    auto = run_installer({**env, "NVIDIA_DRIVER_VERSION": "auto"}, "plan")
    assert auto.returncode == 0, auto.stderr[-2000:]
    said = lines(auto.stdout)
    assert said["version"][0] == "595.91.07"
    assert "no release of it meets the floor kernel-7.0" in said["version"][1]
    assert "  floor: kernel-7.0\n      because R595 or newer" in auto.stdout
