"""`installer run` with the dnf source on Amazon Linux 2023, end to end with the real dnf and rpm:
an AL2023 host root locked to one release (/etc/dnf/vars/releasever) whose amazonlinux.repo
serves that release's kernel-devel, kernel-headers and kernel-modules-extra (signed with
Amazon's key, on 127.0.0.1), and NVIDIA's amzn2023 repo (signed with NVIDIA's, its
nvidia-driver streams and dkms). Shapes and their sources: lib/amazonrepo.py. As in
test_dnf_source, nothing is loaded: the target kernel is not the running one, so DKMS's %post
builds for nothing and the installer's `dkms install -k` does the work."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from kit.rpm import V570, V580A, V580B, Release, RepoSpec, build_extras, install_base
from lib.amazonrepo import kernel_packages, nvidia_repo, nvidia_repo_file
from lib.dnfroots import host_has_files_of
from lib.headerrepos import make_key, publish_dnf
from lib.hostkit import GCC_LINE, INSTALL_DIR_HOST, RUNNING_KERNEL, installer_env, ok, run_installer
from lib.hostshapes import amazon_repos
from lib.hosttrees import make_host
from lib.httpfaults import serve_directory

TOOLS = ("dnf", "rpm", "rpmbuild", "rpmsign", "gpg", "createrepo_c", "modifyrepo_c",
         "makeself", "busybox")
pytestmark = [
    pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS),
                       reason="needs " + ", ".join(TOOLS)),
    pytest.mark.skipif(not list(Path("/usr/src").glob("linux-headers-*-amd64")),
                       reason="needs linux-headers"),
]

KERNEL = "6.1.147-172.266.amzn2023.x86_64"
KERNEL612 = "6.12.40-63.114.amzn2023.x86_64"
# The release the host is locked to: its repo path, never VERSION_ID (2023), holds the kernels.
LOCKED = "2023.9.20251117"
STREAMS = (V580A, V580B)
SPEC = RepoSpec(
    releases=(Release(V580A), Release(V580B)),
    streams=(("580-dkms", STREAMS), ("580-open", STREAMS), ("latest-dkms", STREAMS),
             ("open-dkms", STREAMS)),
    kernels=(),
)


class Archive(NamedTuple):
    base: str
    requests: list[str]
    amazon_key: Any
    repo_file: Path  # NVIDIA's cuda-amzn2023.repo, file://
    no_dkms_file: Path  # the same repo without dkms


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archive]:
    work = tmp_path_factory.mktemp("al2023")
    www = work / "www"
    amazon_key = make_key(work / "amazon-key")
    core = [*kernel_packages(work, KERNEL, amazon_key),
            *kernel_packages(work, KERNEL612, amazon_key)]
    publish_dnf(www / f"us-east-1.amazonaws.com/al2023/core/{LOCKED}/x86_64", core)
    nvidia, _ = nvidia_repo(work, SPEC)
    bare, _ = nvidia_repo(work / "bare", SPEC, with_dkms=False)
    files = work / "repo-files"
    repo_file = nvidia_repo_file(files / "cuda-amzn2023.repo", nvidia)
    no_dkms = nvidia_repo_file(files / "no-dkms" / "cuda-amzn2023.repo", bare)
    with serve_directory(www) as (base, requests):
        yield Archive(base, requests, amazon_key, repo_file, no_dkms)


def make_root(path: Path, archive: Archive) -> Path:
    """AL2023 with an H100, an rpm database holding only kit-base (a shell for scriptlets),
    its amazonlinux.repo and Amazon's key, locked to release LOCKED."""
    root = path / "host"
    make_host(root, distro="amzn-2023", kernel=RUNNING_KERNEL, gpus=(0x2330,))
    with (root / "etc/os-release").open("a") as handle:
        handle.write('PLATFORM_ID="platform:al2023"\n')
    subprocess.run(["rpm", "--root", str(root), "--initdb"], check=True)
    for directory in ("etc/ld.so.conf.d", "etc/modprobe.d", f"lib/modules/{KERNEL}",
                      f"lib/modules/{KERNEL612}"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "proc/version").write_text(GCC_LINE.format(k=RUNNING_KERNEL))
    (root / "dev").mkdir(exist_ok=True)
    os.mknod(root / "dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    install_base(root, build_extras())
    amazon_repos(root, archive.base, archive.amazon_key)
    (root / "etc/dnf/vars/releasever").write_text(f"{LOCKED}\n")
    # The real amazonlinux.repo reaches its region's copy through the host's own dnf vars
    # ($awsregion, $awsdomain in /etc/dnf/vars, written at boot): so does this one.
    repo = root / "etc/yum.repos.d/amazonlinux.repo"
    repo.write_text(repo.read_text().replace(f"{archive.base}/al2023/",
                                             f"{archive.base}/$awsregion.$awsdomain/al2023/"))
    (root / "etc/dnf/vars/awsregion").write_text("us-east-1\n")
    (root / "etc/dnf/vars/awsdomain").write_text("amazonaws.com\n")
    # Every AL2023 host has Amazon's key in its rpm database (its own packages were checked
    # with it) as well as in /etc/pki/rpm-gpg, where its repo file names it.
    subprocess.run(["rpm", "--root", str(root), "--import", str(archive.amazon_key.armored)],
                   check=True)
    host_has_files_of(root, archive.repo_file, archive.no_dkms_file)
    return root


@pytest.fixture
def root(tmp_path: Path, archive: Archive) -> Path:
    return make_root(tmp_path, archive)


def env_for(root: Path, repo_file: Path, version: str, flavour: str = "proprietary",
            kernel: str = KERNEL) -> dict[str, str]:
    return installer_env(root, kernel, NVIDIA_DRIVER_VERSION=version,
                         NVIDIA_KERNEL_MODULE_TYPE=flavour,
                         NVIDIA_DNF_REPO_URL=f"file://{repo_file}",
                         NVIDIA_INSTALLER_RETRIES="1")


def rpms(root: Path) -> list[str]:
    out = subprocess.run(["rpm", "--root", str(root), "-qa", "--qf", "%{NAME}-%{VERSION}\\n"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(n for n in out.split() if not n.startswith(("kit-base-", "gpg-pubkey-")))


def assert_refused_before_any_change(root: Path, result: subprocess.CompletedProcess[str],
                                     code: int, *said: str) -> None:
    """The run exited `code`, its stderr says each of `said`, and no package was installed."""
    assert result.returncode == code, result.stderr[-3000:]
    for text in said:
        assert text in result.stderr
    assert rpms(root) == []


def keys(root: Path) -> int:
    out = subprocess.run(["rpm", "--root", str(root), "-q", "gpg-pubkey"], capture_output=True,
                         text=True)
    return len(out.stdout.split()) if out.returncode == 0 else 0


def stream(root: Path) -> str:
    text = (root / "etc/dnf/modules.d/nvidia-driver.module").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)["stream"]


def inst(root: Path) -> Path:
    return root / INSTALL_DIR_HOST.lstrip("/")



def kernel_rpms(kernel: str, line: str = "kernel") -> list[str]:
    version = kernel.split("-")[0]
    return [f"{line}-devel-{version}", f"{line}-headers-{version}",
            f"{line}-modules-extra-{version}"]


def test_al2023_installs_from_nvidias_amzn2023_streams_with_dkms_for_the_locked_kernel(
        root: Path, archive: Archive) -> None:
    assert keys(root) == 1
    archive.requests.clear()
    result = ok(run_installer(env_for(root, archive.repo_file, V580A), "run"))
    assert rpms(root) == sorted([
        f"nvidia-driver-{V580A}", f"nvidia-driver-cuda-{V580A}", f"nvidia-modprobe-{V580A}",
        f"kmod-nvidia-latest-dkms-{V580A}", "dkms-3.0.13", *kernel_rpms(KERNEL)])
    assert stream(root) == "580-dkms"
    assert "DKMS stream 580-dkms" in result.stderr
    # NVIDIA's key (driver, dkms) was imported beside Amazon's (kernel packages).
    assert keys(root) == 2
    # dnf read the host's lock: the kernel packages came from the locked release's path.
    assert (f"/us-east-1.amazonaws.com/al2023/core/{LOCKED}/x86_64/repodata/repomd.xml"
            in archive.requests)
    assert not [r for r in archive.requests if "/al2023/core/2023/" in r
                or "/al2023/core/latest/" in r]
    assert (root / "etc/yum.repos.d/cuda-amzn2023.repo").is_file()
    extra = root / "lib/modules" / KERNEL / "extra"
    assert sorted(p.name for p in extra.iterdir()) == [
        "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]  # AL2023 compresses none
    assert (root / f"var/lib/dkms/nvidia/{V580A}/{KERNEL}/x86_64/module/nvidia.ko").is_file()
    i = inst(root)
    assert os.readlink(i / "current") == f"versions/{V580A}"
    assert (i / "bin/nvidia-smi").is_file()
    assert os.readlink(i / "lib64/libnvidia-ml.so.1") == f"libnvidia-ml.so.{V580A}"
    record = json.loads((i / "state.json").read_text())
    assert (record["version"], record["kernel"], record["source"]) == (V580A, KERNEL, "dnf")

    again = ok(run_installer(env_for(root, archive.repo_file, V580A), "run"))
    assert "every step was already satisfied" in again.stderr

    # The open flavour of the branch's newest: one transaction to stream 580-open.
    ok(run_installer(env_for(root, archive.repo_file, "580", "open"), "run"))
    assert stream(root) == "580-open"
    assert f"kmod-nvidia-open-dkms-{V580B}" in rpms(root)
    assert "kmod-nvidia-latest-dkms" not in " ".join(rpms(root))
    assert (root / f"var/lib/dkms/nvidia/{V580B}/{KERNEL}/x86_64/module/nvidia.ko").is_file()
    assert os.readlink(inst(root) / "current") == f"versions/{V580B}"


def test_the_612_line_gets_its_own_kernel_packages(root: Path, archive: Archive) -> None:
    ok(run_installer(env_for(root, archive.repo_file, V580B, kernel=KERNEL612), "run"))
    assert set(kernel_rpms(KERNEL612, "kernel6.12")) <= set(rpms(root))
    assert not [n for n in rpms(root) if n.startswith("kernel-")]
    assert (root / f"lib/modules/{KERNEL612}/extra/nvidia.ko").is_file()


def test_a_kernel_the_locked_release_lacks_is_named_with_its_packages(
        root: Path, archive: Archive) -> None:
    other = "6.1.150-180.253.amzn2023.x86_64"
    result = run_installer(env_for(root, archive.repo_file, V580A, kernel=other), "run")
    assert_refused_before_any_change(root, result, 90, "error[amazon-kernel-devel-missing]",
                                     f"kernel-devel-{other}", "/etc/dnf/vars/releasever")


def test_a_version_nvidias_repo_lacks_is_refused_before_any_change(
        root: Path, archive: Archive) -> None:
    result = run_installer(env_for(root, archive.repo_file, V570), "run")
    assert_refused_before_any_change(root, result, 92, "error[amazon-driver-missing]",
                                     "nvidia-driver:570-dkms")


def test_without_dkms_in_nvidias_repo_the_al2023_reason_is_given(
        root: Path, archive: Archive) -> None:
    result = run_installer(env_for(root, archive.no_dkms_file, V580A), "run")
    assert_refused_before_any_change(root, result, 91, "error[amazon-dkms-missing]",
                                     "no EPEL")
