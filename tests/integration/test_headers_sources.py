"""Kernel headers from the host's own package sources: real apt-get and dnf against
signed local archives on 127.0.0.1 shaped like Debian's, Ubuntu's and Rocky's, real dpkg-deb and
rpm2cpio, and `installer plan`/`run` that fail before the driver download when they cannot."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kit
import pytest
from lib.headerrepos import (
    Key,
    apt_sources,
    kernel_devel_rpm,
    make_key,
    publish_apt,
    publish_dnf,
    real_debian_debs,
    rocky_repos,
    ubuntu_shape_debs,
)
from lib.hostkit import (
    INSTALL_DIR_HOST,
    RUNNING_KERNEL,
    debian_headers,
    installer_env,
    make_debian_host,
    run_installer,
)
from lib.hosttrees import make_host
from lib.httpfaults import serve_directory

from installer.config import from_env
from installer.errors import HeadersFetchFailed, KernelHeadersMissing
from installer.headers import compiler, fetch
from installer.host import gather
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.runner import SubprocessRunner

_TOOLS = ("apt-get", "dpkg-deb", "dpkg-scanpackages", "gpg", "dnf", "rpmbuild", "rpmsign",
          "createrepo_c", "rpm2cpio", "cpio")
_MISSING = [t for t in _TOOLS if shutil.which(t) is None] + (
    ["linux-headers-amd64"] if debian_headers() is None else [])
# Under CI a missing tool fails the tests instead (the archive fixture asserts on each tool).
pytestmark = pytest.mark.skipif(bool(_MISSING) and not os.environ.get("CI"),
                                reason=f"needs {', '.join(_MISSING)}")

DEBIAN_K = debian_headers()[0] if debian_headers() else "6.1.0-56-amd64"
JAMMY_K, JAMMY_BASE = "5.15.0-105-generic", "linux-headers-5.15.0-105"
FOCAL_K, FOCAL_BASE = "5.4.0-200-generic", "linux-headers-5.4.0-200"
NOBLE_K, NOBLE_BASE = "6.8.0-1008-aws", "linux-aws-headers-6.8.0-1008"
ROCKY9_K = "5.14.0-427.13.1.el9_4.x86_64"
ROCKY8_K = "4.18.0-513.24.1.el8_9.x86_64"
UNREACHABLE = "http://127.0.0.1:9"
VERSION = "580.105.08"
GCC9 = ("Linux version 5.4.0-200-generic (buildd@lcy02-amd64-023) (gcc version 9.4.0 (Ubuntu "
        "9.4.0-1ubuntu1~20.04.2)) #220-Ubuntu SMP Fri Sep 27 13:19:16 UTC 2024\n")
GCC13 = ("Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075) (x86_64-linux-gnu-gcc-13 "
         "(Ubuntu 13.2.0-23ubuntu4) 13.2.0, GNU ld (GNU Binutils for Ubuntu) 2.42) #45-Ubuntu\n")


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Key, list[str]]]:
    """One server: debian/ (Debian's real header packages, re-signed), ubuntu/ (Ubuntu's two-
    package shape for jammy and noble), rocky/ (kernel-devel in AppStream and in the vault),
    runfiles/ (the kit's .run)."""
    work = tmp_path_factory.mktemp("archive")
    www = work / "www"
    key = make_key(work / "key")
    debs = real_debian_debs(DEBIAN_K)
    if debs is None:
        pytest.fail("Debian's header .debs are missing: run scripts/install-deps")
    publish_apt(www / "debian", "bookworm", debs, key)
    publish_apt(www / "ubuntu", "jammy",
                ubuntu_shape_debs(work / "jammy", JAMMY_K, JAMMY_BASE, 110400), key)
    publish_apt(www / "ubuntu", "focal",
                ubuntu_shape_debs(work / "focal", FOCAL_K, FOCAL_BASE, 90400), key)
    publish_apt(www / "ubuntu", "noble",
                ubuntu_shape_debs(work / "noble", NOBLE_K, NOBLE_BASE, 130200), key)
    rpm = kernel_devel_rpm(work / "rpm9", ROCKY9_K, key)
    # 9.4's kernel is in the current repos for a 9.4 host, and only in the vault for a 9.5 one.
    publish_dnf(www / "rocky/9.4/AppStream/x86_64/os", [rpm])
    publish_dnf(www / "vault/9.4/AppStream/x86_64/os", [rpm])
    # Rocky 8: a 8.10 node still running 8.9's kernel finds it only in 8.9's vault.
    publish_dnf(www / "vault/8.9/AppStream/x86_64/os", [kernel_devel_rpm(work / "rpm8", ROCKY8_K,
                                                                         key)])
    for sub in ("rocky/9.4/BaseOS/x86_64/os", "rocky/9.5/BaseOS/x86_64/os",
                "rocky/9.5/AppStream/x86_64/os", "vault/9.4/BaseOS/x86_64/os",
                "rocky/8.10/BaseOS/x86_64/os", "rocky/8.10/AppStream/x86_64/os",
                "vault/8.9/BaseOS/x86_64/os"):
        publish_dnf(www / sub, [])
    kit.build_runfile(VERSION, www / "runfiles" / VERSION)
    with serve_directory(www) as (base, requests):
        yield base, www, key, requests


def obtain(root: Path, kernel: str, **settings: str) -> Any:
    env = {"ROOT_MOUNT_DIR": str(root), "NVIDIA_INSTALL_DIR_HOST": INSTALL_DIR_HOST,
           "NVIDIA_KERNEL_RELEASE": kernel, **settings}
    config = from_env(env)
    host_root = HostRoot(root)
    facts = gather(host_root, kernel_override=kernel, free_space_path=root)
    layout = Layout.from_config(config, host_root)
    return fetch.obtain(host_root, config, facts, layout, SubprocessRunner())


def cache_of(root: Path, kernel: str) -> Path:
    return root / INSTALL_DIR_HOST.lstrip("/") / "cache/headers" / kernel


def ubuntu_host(tmp_path: Path, release: str, kernel: str, base: str, suite: str, key: Key, *,
                deb822: bool = False) -> Path:
    """An Ubuntu `release` node on `kernel` whose apt sources name the archive's `suite`."""
    root = tmp_path / "host"
    make_host(root, distro=f"ubuntu-{release}", kernel=kernel)
    apt_sources(root, f"{base}/ubuntu", suite, key, deb822=deb822)
    return root


def fetching_env(root: Path, kernel: str, base: str, **settings: str) -> dict[str, str]:
    """The installer's settings on `root` for `kernel`: the driver from the archive's runfiles,
    the kernel's headers fetched when missing."""
    return installer_env(root, kernel, NVIDIA_DRIVER_VERSION=VERSION,
                         NVIDIA_DRIVER_MIRRORS=f"{base}/runfiles",
                         NVIDIA_INSTALLER_FETCH_HEADERS="true", **settings)


def assert_host_package_state_untouched(root: Path) -> None:
    for path in ("var/lib/dpkg", "var/lib/apt", "var/cache/apt", "var/lib/rpm", "var/lib/dnf",
                 "var/cache/dnf", "var/log"):
        assert not (root / path).exists(), path


def test_ubuntu_2204_both_packages_from_the_hosts_one_line_sources(archive: Any,
                                                                   tmp_path: Path) -> None:
    base, _, key, requests = archive
    root = ubuntu_host(tmp_path, "22.04", JAMMY_K, base, "jammy", key)
    requests.clear()
    headers = obtain(root, JAMMY_K)
    cache = cache_of(root, JAMMY_K)
    assert headers.unpacked_root == cache / "root"
    assert (cache / ".complete").read_text().split() == [f"linux-headers-{JAMMY_K}", JAMMY_BASE]
    flavour = cache / "root/usr/src" / f"linux-headers-{JAMMY_K}"
    assert os.readlink(flavour / "Makefile") == f"../{JAMMY_BASE}/Makefile"
    assert (flavour / "Makefile").is_file() and (flavour / ".config").is_file()
    assert os.readlink(cache / "root/lib/modules" / JAMMY_K / "build") == (
        f"/usr/src/linux-headers-{JAMMY_K}")
    assert sorted(os.listdir(cache)) == [".complete", "root"]
    assert any(r.endswith("/dists/jammy/InRelease") for r in requests)
    assert any(r.endswith(f"{JAMMY_BASE}_5.15.0-105.1_all.deb") for r in requests)
    assert_host_package_state_untouched(root)


def test_ubuntu_2004_both_packages_and_gcc_9_from_the_headers(archive: Any,
                                                              tmp_path: Path) -> None:
    """Ubuntu 20.04 (seeds/001's nodes): focal's one-line sources, both packages; the fetched
    headers say gcc 9, which the ubuntu20.04 image carries."""
    base, _, key, requests = archive
    root = ubuntu_host(tmp_path, "20.04", FOCAL_K, base, "focal", key)
    requests.clear()
    headers = obtain(root, FOCAL_K)
    cache = cache_of(root, FOCAL_K)
    assert (cache / ".complete").read_text().split() == [f"linux-headers-{FOCAL_K}", FOCAL_BASE]
    assert headers.unpacked_root is not None
    flavour = headers.unpacked_root / f"usr/src/linux-headers-{FOCAL_K}"
    assert compiler.headers_gcc_major(flavour) == 9
    assert compiler.tags_with(9) == ["ubuntu20.04"]
    assert any(r.endswith("/dists/focal/InRelease") for r in requests)
    assert_host_package_state_untouched(root)


def test_ubuntu_2404_deb822_sources_with_signed_by(archive: Any, tmp_path: Path) -> None:
    base, _, key, _ = archive
    root = ubuntu_host(tmp_path, "24.04", NOBLE_K, base, "noble", key, deb822=True)
    obtain(root, NOBLE_K)
    cache = cache_of(root, NOBLE_K)
    assert (cache / ".complete").read_text().split() == [f"linux-headers-{NOBLE_K}", NOBLE_BASE]
    assert (cache / "root/usr/src" / NOBLE_BASE / "Makefile").is_file()


def test_a_source_signed_by_an_unknown_key_gives_nothing(archive: Any, tmp_path: Path) -> None:
    base, _, _, _ = archive
    other = make_key(tmp_path / "other-key")
    root = ubuntu_host(tmp_path, "22.04", JAMMY_K, base, "jammy", other)
    with pytest.raises(KernelHeadersMissing) as info:
        obtain(root, JAMMY_K)
    assert "NO_PUBKEY" in info.value.message or "not signed" in info.value.message
    assert not cache_of(root, JAMMY_K).exists()
    assert not cache_of(root, JAMMY_K).with_name(f".{JAMMY_K}.tmp").exists()


def test_headers_that_exist_nowhere_name_package_kernel_and_sources(archive: Any,
                                                                    tmp_path: Path) -> None:
    base, _, key, _ = archive
    root = ubuntu_host(tmp_path, "22.04", "5.15.0-999-generic", base, "jammy", key)
    with pytest.raises(KernelHeadersMissing) as info:
        obtain(root, "5.15.0-999-generic")
    message = info.value.message
    assert "linux-headers-5.15.0-999-generic: no source has it" in message
    assert "no kernel headers for kernel 5.15.0-999-generic" in message
    assert "/etc/apt/sources.list" in message


def rocky_host(tmp_path: Path, base: str, key: Key, minor: str) -> Path:
    major = int(minor.split(".")[0])
    root = tmp_path / "host"
    make_host(root, distro=f"rocky-{major}", kernel=ROCKY9_K if major == 9 else ROCKY8_K)
    text = (root / "etc/os-release").read_text()
    (root / "etc/os-release").write_text(re.sub(r'"\d+\.\d+"', f'"{minor}"', text))
    # The repos of the host's minor (what Rocky's mirrorlist hands a node of that minor).
    rocky_repos(root, major, base, key, {"baseos": f"rocky/{minor}/BaseOS/$basearch/os/",
                                         "appstream": f"rocky/{minor}/AppStream/$basearch/os/"})
    return root


def assert_kernel_devel_cached(root: Path, headers: Any, kernel: str) -> None:
    """kernel-devel of `kernel` unpacked into the cache, one tree as source and output path."""
    tree = cache_of(root, kernel) / "root/usr/src/kernels" / kernel
    assert str(headers.output_path) == str(headers.source_path) == f"/usr/src/kernels/{kernel}"
    assert (tree / "Makefile").is_file() and (tree / "scripts/mod/modpost").is_file()
    assert (cache_of(root, kernel) / ".complete").read_text().split() == [
        f"kernel-devel-{kernel}"]


def test_rocky_9_kernel_devel_from_the_hosts_repos_signature_checked(archive: Any,
                                                                     tmp_path: Path) -> None:
    base, _, key, requests = archive
    root = rocky_host(tmp_path, base, key, "9.4")
    requests.clear()
    headers = obtain(root, ROCKY9_K, NVIDIA_INSTALLER_ROCKY_VAULT=UNREACHABLE)
    assert_kernel_devel_cached(root, headers, ROCKY9_K)
    assert any(r.startswith("/rocky/9.4/AppStream/x86_64/os/") and r.endswith(".rpm")
               for r in requests)
    assert_host_package_state_untouched(root)


def test_rocky_older_minor_comes_from_the_vault(archive: Any, tmp_path: Path) -> None:
    base, _, key, requests = archive
    root = rocky_host(tmp_path, base, key, "9.5")
    requests.clear()
    obtain(root, ROCKY9_K, NVIDIA_INSTALLER_ROCKY_VAULT=f"{base}/vault")
    assert (cache_of(root, ROCKY9_K) / "root/usr/src/kernels" / ROCKY9_K / "Makefile").is_file()
    assert any(r.startswith("/vault/9.4/AppStream/x86_64/os/") and r.endswith(".rpm")
               for r in requests)


def test_rocky_8_node_one_minor_behind_gets_kernel_devel_from_the_vault(
        archive: Any, tmp_path: Path) -> None:
    """A Rocky 8.10 node still running 8.9's kernel: its repos no longer carry it; the vault of
    8.9 does (signature checked with the host's rockyofficial key), unpacked into the cache."""
    base, _, key, requests = archive
    root = rocky_host(tmp_path, base, key, "8.10")
    requests.clear()
    headers = obtain(root, ROCKY8_K, NVIDIA_INSTALLER_ROCKY_VAULT=f"{base}/vault")
    assert_kernel_devel_cached(root, headers, ROCKY8_K)
    assert any(r.startswith("/vault/8.9/AppStream/x86_64/os/") and r.endswith(".rpm")
               for r in requests)
    assert_host_package_state_untouched(root)


def test_rocky_8_plan_names_the_vault_of_the_kernels_minor(tmp_path: Path) -> None:
    root = tmp_path / "host"
    make_host(root, distro="rocky-8", kernel=RUNNING_KERNEL, gpus=(0x2330,))
    (root / "etc/yum.repos.d").mkdir(parents=True)
    (root / "etc/yum.repos.d/Rocky-BaseOS.repo").write_text(
        "[baseos]\nname=Rocky Linux $releasever - BaseOS\nmirrorlist=https://mirrors.rockylinux"
        ".org/mirrorlist?arch=$basearch&repo=BaseOS-$releasever\ngpgcheck=1\nenabled=1\n"
        "gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-rockyofficial\n")
    env = installer_env(root, ROCKY8_K, NVIDIA_DRIVER_VERSION=VERSION,
                        NVIDIA_DRIVER_SOURCE="runfile", NVIDIA_INSTALLER_FETCH_HEADERS="true")
    plan = run_installer(env, "plan")
    assert plan.returncode == 0, plan.stderr
    assert f"kernel-headers: fetch kernel-devel-{ROCKY8_K}\n" in plan.stdout
    assert ("because from the host's package sources (/etc/yum.repos.d/Rocky-BaseOS.repo) and "
            "Rocky's vault for 8.9 (https://dl.rockylinux.org/vault/rocky) with the image's dnf"
            ) in plan.stdout


def test_rhel_repos_with_an_untrusted_signature_fail_and_leave_nothing(archive: Any,
                                                                       tmp_path: Path) -> None:
    base, _, _, _ = archive
    root = tmp_path / "host"
    make_host(root, distro="rhel-9", kernel=ROCKY9_K)
    other = make_key(tmp_path / "other-key")
    pki = root / "etc/pki/rpm-gpg"
    pki.mkdir(parents=True)
    shutil.copy2(other.armored, pki / "RPM-GPG-KEY-redhat-release")
    entitlement = root / "etc/pki/entitlement"
    entitlement.mkdir(parents=True)
    (root / "etc/yum.repos.d").mkdir(parents=True)
    (root / "etc/yum.repos.d/redhat.repo").write_text(
        "[rhel-9-for-x86_64-appstream-rpms]\nname=Red Hat Enterprise Linux 9 - AppStream\n"
        f"baseurl={base}/rocky/9.4/AppStream/$basearch/os\nenabled=1\ngpgcheck=1\n"
        "gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-redhat-release\n"
        "sslclientcert=/etc/pki/entitlement/1.pem\nsslclientkey=/etc/pki/entitlement/1-key.pem\n")
    with pytest.raises(HeadersFetchFailed) as info:
        obtain(root, ROCKY9_K)
    assert f"kernel-devel-{ROCKY9_K}" in info.value.message
    assert not (root / INSTALL_DIR_HOST.lstrip("/") / "cache/headers").exists() or not any(
        (root / INSTALL_DIR_HOST.lstrip("/") / "cache/headers").iterdir())


# --- installer plan / run ----------------------------------------------------------------


def debian_host(tmp_path: Path, key: Key, sources: str) -> Path:
    root = tmp_path / "host"
    make_debian_host(root, headers=False)
    apt_sources(root, sources, "bookworm", key, deb822=False)
    return root


def air_gapped_node(tmp_path: Path, archive: Any) -> tuple[Path, dict[str, str]]:
    """Debian 12 with no route to its sources, set to fetch its headers from the mirror and the
    driver from the archive's runfiles (vouched for by a digests file)."""
    base, www, key, _ = archive
    root = debian_host(tmp_path, key, f"{UNREACHABLE}/debian")
    env = fetching_env(root, DEBIAN_K, base,
                       NVIDIA_DRIVER_DIGESTS_FILE=str(kit.write_digests(tmp_path / "digests",
                                                                         www / "runfiles")),
                       NVIDIA_INSTALLER_HEADERS_MIRROR=f"{base}/debian")
    return root, env


def test_air_gapped_debian_node_builds_with_headers_from_the_mirror(archive: Any,
                                                                    tmp_path: Path) -> None:
    """No route to the host's sources; the mirror has them: fetched before the driver, built
    against, cached for the next run (which asks the archive for nothing)."""
    base, _, _, requests = archive
    root, env = air_gapped_node(tmp_path, archive)
    plan = run_installer(env, "plan")
    assert plan.returncode == 0, plan.stderr
    assert f"kernel-headers: fetch linux-headers-{DEBIAN_K}" in plan.stdout
    assert f"the mirror {base}/debian (in place of the URIs in /etc/apt/sources.list)" in (
        plan.stdout)
    assert "compiler: from the headers" in plan.stdout
    requests.clear()
    result = run_installer(env, "run", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    first_runfile = next(i for i, r in enumerate(requests) if r.endswith(".run"))
    assert any(r.endswith(".deb") for r in requests[:first_runfile])
    cache = cache_of(root, DEBIAN_K)
    assert (cache / ".complete").read_text().split() == [
        f"linux-headers-{DEBIAN_K}", f"linux-headers-{DEBIAN_K.removesuffix('-amd64')}-common",
        "linux-kbuild-6.1"]
    install = root / INSTALL_DIR_HOST.lstrip("/")
    assert (install / "drivers/nvidia.ko").is_file()
    assert "using gcc-12" not in result.stderr and "gcc" in result.stderr
    assert_host_package_state_untouched(root)
    # A later run (another driver build for the same kernel) reuses the cache.
    shutil.rmtree(install / "cache/modules")
    replan = run_installer(env, "plan")
    assert f"kernel-headers: /usr/src/linux-headers-{DEBIAN_K}" in replan.stdout
    assert "fetched by an earlier run" in replan.stdout
    assert "compiler: gcc-12" in replan.stdout
    requests.clear()
    again = run_installer(env, "run", timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not [r for r in requests if "/debian/" in r]


def test_prebuild_gets_the_headers_of_a_kernel_not_running_as_a_node_does(
        archive: Any, tmp_path: Path) -> None:
    """`installer prebuild --kernel K` (a CI job ahead of a kernel rollout) on a
    machine without K's headers fetches them the way a node does (here from the mirror), builds,
    and installs nothing on the host."""
    _, _, _, requests = archive
    root, env = air_gapped_node(tmp_path, archive)
    env.pop("NVIDIA_KERNEL_RELEASE")
    requests.clear()
    result = run_installer(env, "prebuild", "--kernel", DEBIAN_K, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    built = Path(result.stdout.strip())
    assert DEBIAN_K in built.parts
    assert {p.name for p in built.glob("*.ko")} >= {"nvidia.ko", "nvidia-modeset.ko",
                                                    "nvidia-uvm.ko"}
    assert (cache_of(root, DEBIAN_K) / ".complete").is_file()
    assert any(r.endswith(".deb") for r in requests)
    assert not (root / "lib/modules" / DEBIAN_K / "updates").exists()
    assert not (root / INSTALL_DIR_HOST.lstrip("/") / "drivers").exists()
    assert_host_package_state_untouched(root)


def test_headers_nowhere_fail_before_the_driver_download(archive: Any, tmp_path: Path) -> None:
    base, _, key, requests = archive
    root = debian_host(tmp_path, key, f"{base}/debian")
    kernel = "6.1.0-99-amd64"
    (root / "lib/modules" / kernel).mkdir(parents=True)
    env = fetching_env(root, kernel, base)
    requests.clear()
    result = run_installer(env, "run")
    assert result.returncode == 30, result.stderr[-3000:]
    assert "error[kernel-headers-missing]" in result.stderr
    assert f"linux-headers-{kernel}: no source has it" in result.stderr
    assert "the host's package sources (/etc/apt/sources.list)" in result.stderr
    assert not [r for r in requests if r.endswith(".run")]


def test_fetching_off_and_no_headers_plan_says_so_and_run_downloads_nothing(
        archive: Any, tmp_path: Path) -> None:
    base, _, key, requests = archive
    root = debian_host(tmp_path, key, f"{base}/debian")
    env = installer_env(root, DEBIAN_K, NVIDIA_DRIVER_VERSION=VERSION,
                        NVIDIA_DRIVER_MIRRORS=f"{base}/runfiles")
    plan = run_installer(env, "plan")
    assert "kernel-headers: missing" in plan.stdout
    assert "NVIDIA_INSTALLER_FETCH_HEADERS=false" in plan.stdout
    assert "`run` fails before downloading the driver" in plan.stdout
    requests.clear()
    result = run_installer(env, "run")
    assert result.returncode == 30
    assert requests == []


@pytest.mark.parametrize(("distro", "kernel", "proc_version", "major", "tag"), [
    ("ubuntu-20.04", "5.4.0-200-generic", GCC9, 9, "ubuntu20.04"),
    ("ubuntu-24.04", "6.8.0-45-generic", GCC13, 13, "ubuntu24.04"),
], ids=["older-host", "newer-host"])
def test_host_release_other_than_the_images_names_compiler_and_tag(
        archive: Any, tmp_path: Path, distro: str, kernel: str, proc_version: str, major: int,
        tag: str) -> None:
    """This image (Debian 12, gcc 12) on an older and a newer Ubuntu: the kernel's gcc is
    known from /proc/version, so plan says so and run fails before downloading anything."""
    base, _, key, requests = archive
    root = tmp_path / "host"
    make_host(root, distro=distro, kernel=kernel, gpus=(0x2330,))
    (root / "proc/version").write_text(proc_version)
    apt_sources(root, f"{base}/ubuntu", "noble", key, deb822=distro == "ubuntu-24.04")
    env = fetching_env(root, kernel, base)
    plan = run_installer(env, "plan")
    assert "compiler: missing" in plan.stdout, plan.stdout
    assert f"use the installer image tag {tag}" in plan.stdout
    requests.clear()
    result = run_installer(env, "run")
    assert result.returncode == 43, result.stderr[-3000:]
    assert "error[compiler-missing]" in result.stderr
    assert f"Compiler gcc-{major}: use the installer image tag {tag}" in result.stderr
    assert requests == []


def test_jammy_headers_fetched_then_compiler_missing_before_the_driver(archive: Any,
                                                                        tmp_path: Path) -> None:
    """Build-ahead for a jammy kernel: its gcc (11) is only known from the fetched headers'
    config; run stops there, before the .run."""
    base, _, key, requests = archive
    root = tmp_path / "host"
    make_host(root, distro="ubuntu-22.04", kernel=RUNNING_KERNEL, gpus=(0x2330,))
    apt_sources(root, f"{base}/ubuntu", "jammy", key, deb822=False)
    env = fetching_env(root, JAMMY_K, base)
    requests.clear()
    result = run_installer(env, "run")
    assert result.returncode == 43, result.stderr[-3000:]
    assert "gcc 11 (the headers' CONFIG_GCC_VERSION)" in result.stderr
    assert "ubuntu22.04 or rocky9" in result.stderr
    assert any(r.endswith(".deb") for r in requests)
    assert not [r for r in requests if r.endswith(".run")]



def test_headers_in_the_image_are_used_at_their_own_paths() -> None:
    """The installer's own image (here: this machine, Debian's headers installed): no bind
    mounts, and Debian's split trees as source and output (nvidia-installer looks for kernel.h
    in the source tree and the configuration in the output tree)."""
    from installer.headers import trees

    found = debian_headers()
    assert found is not None
    release, (amd64, common, _kbuild) = found
    headers = trees.find_container_headers(release)
    assert headers is not None and headers.in_container and headers.binds == ()
    assert (str(headers.source_path), str(headers.output_path)) == (common, amd64)
    assert trees.with_host_trees(HostRoot(Path("/root")), headers, ["make"]) == ["make"]
