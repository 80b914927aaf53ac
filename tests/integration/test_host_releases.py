"""Each posed host release (tests/lib/hosts/*.json: Ubuntu 24.04 and 26.04 in every flavour
fleets use, Oracle Linux 8-10 with UEK and RHCK, Amazon Linux 2023 on both kernel lines, RHEL's
+64k kernels, Rocky 10): `installer plan` on a posed root states the source, the headers
package, the compiler, the image tag, the architecture, the flavour and the page size; then the
family's own code fetches the headers with real apt-get or dnf from signed repos on 127.0.0.1
shaped like the distribution's, and plan reads the fetched headers' config. Unsupported releases
and a 590 driver on a 64k-page kernel are refused before anything changes."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lib import hostreleases
from lib.headerrepos import make_key, publish_apt, publish_dnf
from lib.hostkit import INSTALL_DIR_HOST, installer_env, run_installer
from lib.hostreleases import PosedHost
from lib.hostshapes import el_devel_rpm, pose_host, pose_release, release_sources, ubuntu_debs
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

VERSION = "580.105.08"  # where the release names no driver_version of its own
UNREACHABLE = "http://127.0.0.1:9"
HOSTS = hostreleases.posed_hosts()


def version_of(host: PosedHost) -> str:
    return host.release.driver_version or VERSION


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, list[str]]]:
    """One server with every distribution's repos: Ubuntu's (per suite and architecture, on
    archive.ubuntu.com's and ports.ubuntu.com's paths) and the EL rebuilds' and Amazon's."""
    work = tmp_path_factory.mktemp("host-releases")
    www = work / "www"
    key = make_key(work / "key")
    debs: dict[tuple[str, str], list[Path]] = {}
    rpms: dict[str, list[Path]] = {}
    for name, (release, kernel) in HOSTS.items():
        assert kernel.gcc is not None, name
        if kernel.common_package:
            top = "ubuntu" if kernel.arch == "x86_64" else "ubuntu-ports"
            debs.setdefault((top, release.codename), []).extend(
                ubuntu_debs(work / name, kernel.release, kernel.common_package, kernel.arch,
                            kernel.gcc, kernel.page_kib))
        else:
            rpm = el_devel_rpm(work / name, kernel.package_name, kernel.release, kernel.arch, key,
                               kernel.gcc, kernel.page_kib)
            rpms.setdefault(kernel.repo, []).append(rpm)
    for (top, suite), found in debs.items():
        publish_apt(www / top, suite, found, key, arch="amd64" if top == "ubuntu" else "arm64")
    for where, found in rpms.items():
        publish_dnf(www / where, found)
    # The other repos the hosts' files name, empty (dnf reads each).
    for where in sorted({repo for release, _ in HOSTS.values() for repo in release.repos}):
        if not (www / where / "repodata").is_dir():
            publish_dnf(www / where, [])
    with serve_directory(www) as (base, requests):
        yield base, key, requests


def posed(tmp_path: Path, host: PosedHost, base: str, key: Any) -> Path:
    root = pose_release(tmp_path / "host", host)
    release_sources(root, host.release, host.kernel.arch, base, key)
    return root


def env_for(root: Path, host: PosedHost, **settings: str) -> dict[str, str]:
    return installer_env(root, host.kernel.release, **{
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
    release, kernel = host
    root = posed(tmp_path, host, base, key)
    env = env_for(root, host)
    said = planned(env)
    assert said["source"][0] == "runfile"
    assert said["kernel-headers"][0] == f"fetch {kernel.headers_package}"
    assert said["headers-package"][0] == kernel.headers_package
    assert said["image-tag"][0] == release.image_tag
    assert f"kernel built with gcc {kernel.gcc} (/proc/version)" in said["image-tag"][1]
    assert said["compiler"][0] == "missing"  # this machine has gcc 12 only
    assert f"gcc-{kernel.gcc}: use the installer image tag" in said["compiler"][1]
    assert said["architecture"][0] == kernel.arch
    version = version_of(host)
    assert said["version"][0] == version
    assert f"NVIDIA-Linux-{kernel.arch}-{version}.run" in said["architecture"][1]
    assert f"/NVIDIA-Linux-{kernel.arch}-{version}.run" in said["download"][0]
    assert said["kernel-flavour"][0] == kernel.flavour
    page = said["page-size"]
    if kernel.arch == "x86_64":
        assert page == ("4 KiB", "from x86_64 kernels have 4 KiB pages only")
    elif kernel.release.endswith("64k"):
        assert page[0] == "64 KiB" and "the kernel's name" in page[1]
    else:
        assert page[0] == "unknown"

    # The run's header fetch, through the family's own code: real apt-get or dnf reading the
    # host's sources (re-rooted), signatures checked, unpacked into the cache.
    requests.clear()
    config = from_env(env)
    host_root = HostRoot(root)
    facts = gather(host_root, kernel_override=kernel.release, free_space_path=root)
    headers = fetch.obtain(host_root, config, facts, Layout.from_config(config, host_root),
                           SubprocessRunner())
    cache = root / INSTALL_DIR_HOST.lstrip("/") / "cache/headers" / kernel.release
    assert headers.unpacked_root == cache / "root"
    fetched = (cache / ".complete").read_text().split()
    assert fetched == ([kernel.headers_package, kernel.common_package] if kernel.common_package
                       else [kernel.headers_package])
    downloaded = [r.rsplit("/", 1)[-1] for r in requests if r.endswith((".deb", ".rpm"))]
    assert any(d.startswith(f"{kernel.package_name}-")
               or d.startswith(f"{kernel.headers_package}_") for d in downloaded), downloaded
    for path in ("var/lib/dpkg", "var/lib/apt", "var/lib/rpm", "var/lib/dnf", "var/cache"):
        assert not (root / path).exists(), path

    # On arm64, plan now reads the fetched headers: their config's gcc and page size (once is
    # enough elsewhere: the reading is the family-independent headers code).
    if kernel.page_kib:
        again = planned(env)
        assert "fetched by an earlier run" in again["kernel-headers"][1]
        assert f"gcc {kernel.gcc} (the headers' CONFIG_GCC_VERSION)" in again["image-tag"][1]
        assert again["page-size"][0] == f"{kernel.page_kib} KiB"
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
    root = pose_release(tmp_path / "host", host)
    (root / "boot").mkdir()
    (root / "boot" / f"config-{host.kernel.release}").write_text(
        "CONFIG_ARM64=y\n# CONFIG_ARM64_4K_PAGES is not set\nCONFIG_ARM64_64K_PAGES=y\n"
        "CONFIG_ARM64_PAGE_SHIFT=16\n")
    fine = lines(run_installer(env_for(root, host), "plan").stdout)
    assert fine["page-size"][0] == "64 KiB"
    assert f"/boot/config-{host.kernel.release}" in fine["page-size"][1]
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
    root = pose_release(tmp_path / "host", HOSTS["rhel9-64k"])
    result = run_installer(env_for(root, HOSTS["rhel9-64k"]), "verify", "--json")
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
    generic = HOSTS["resolute-generic"]  # 7.0.0-15: the same release one ABI earlier
    earlier = generic.kernel.proc_version.replace("7.0.0-15", "7.0.0-14").replace("#15-", "#14-")
    host = generic._replace(kernel=generic.kernel._replace(release="7.0.0-14-generic",
                                                           proc_version=earlier))
    root = pose_release(tmp_path / "host", host)
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
