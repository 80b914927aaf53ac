"""`installer run` with the dnf source end to end: the real dnf and rpm against a Rocky 9.4 host
root with an initialised rpm database, and a module-stream repo of the fake driver built by
kit.rpm, served from file:// and http://127.0.0.1. Nothing is loaded here: the host root's
running kernel differs from the kernel the packages are for (building ahead), as in
test_run_runfile."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import testinfra
from hostkit import GCC_LINE, INSTALL_DIR_HOST, RUNNING_KERNEL, installer_env, run_installer
from hosttrees import make_host
from httpfaults import serve_directory
from kit.rpm import KERNEL, V575, V580A, V580B, build_repo, write_repo_file

TOOLS = ("dnf", "rpm", "rpmbuild", "createrepo_c", "modifyrepo_c", "makeself")
pytestmark = [
    pytest.mark.skipif(
        any(shutil.which(t) is None for t in TOOLS), reason="needs " + ", ".join(TOOLS)
    ),
    pytest.mark.skipif(
        not list(Path("/usr/src").glob("linux-headers-*-amd64")), reason="needs linux-headers"
    ),
]

REPO_ID = "cuda-rhel9-x86_64"


@pytest.fixture(scope="module")
def repo() -> Path:
    return build_repo()


@pytest.fixture(scope="module")
def repo_files(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """URLs of .repo files: the repo over file://, over http://127.0.0.1, and a dead server."""
    www = tmp_path_factory.mktemp("www")
    os.symlink(repo, www / "repo")
    with serve_directory(www) as (base, _requests):
        yield _repo_urls(www, repo, base)


def _repo_urls(www: Path, repo: Path, base: str) -> dict[str, str]:
    write_repo_file(www / "cuda-rhel9.repo", f"{base}/repo", REPO_ID)
    local = write_repo_file(www / "file" / "cuda-rhel9.repo", f"file://{repo}", REPO_ID)
    dead = write_repo_file(
        www / "dead" / "cuda-rhel9.repo", f"http://127.0.0.1:{_closed_port()}/r", REPO_ID
    )
    return {
        "http": f"{base}/cuda-rhel9.repo",
        "file": f"file://{local}",
        "dead": f"file://{dead}",
        "nowhere": f"http://127.0.0.1:{_closed_port()}/cuda-rhel9.repo",
    }


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Rocky 9.4 with an H100, an empty rpm database and /etc/yum.repos.d."""
    root = tmp_path / "host"
    make_host(root, distro="rocky-9", kernel=RUNNING_KERNEL, gpus=(0x2330,))
    with (root / "etc/os-release").open("a") as handle:
        handle.write('PLATFORM_ID="platform:el9"\n')
    subprocess.run(["rpm", "--root", str(root), "--initdb"], check=True)
    for directory in (
        "etc/yum.repos.d",
        "etc/ld.so.conf.d",
        "etc/modprobe.d",
        f"lib/modules/{KERNEL}",
    ):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "proc/version").write_text(GCC_LINE.format(k=RUNNING_KERNEL))
    return root


def env_for(
    root: Path, repo_url: str, version: str, flavour: str = "proprietary", **settings: str
) -> dict[str, str]:
    return installer_env(
        root,
        KERNEL,
        NVIDIA_DRIVER_VERSION=version,
        NVIDIA_KERNEL_MODULE_TYPE=flavour,
        NVIDIA_DNF_REPO_URL=repo_url,
        NVIDIA_INSTALLER_RETRIES="1",
        **settings,
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def rpms(root: Path) -> list[str]:
    out = subprocess.run(
        ["rpm", "--root", str(root), "-qa", "--qf", "%{NAME}-%{VERSION}\\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(out.split())


def stream(root: Path) -> str:
    text = (root / "etc/dnf/modules.d/nvidia-driver.module").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)["stream"]


def inst(root: Path) -> Path:
    return root / INSTALL_DIR_HOST.lstrip("/")


def record(root: Path) -> dict[str, Any]:
    return dict(json.loads((inst(root) / "state.json").read_text()))


def driver_rpms(version: str, kmod: str = "kmod-nvidia-latest-dkms") -> list[str]:
    return sorted(
        [
            f"nvidia-driver-{version}",
            f"nvidia-driver-cuda-{version}",
            f"nvidia-modprobe-{version}",
            f"{kmod}-{version}",
            f"kernel-devel-{KERNEL.split('-')[0]}",
            f"kernel-headers-{KERNEL.split('-')[0]}",
        ]
    )


def test_branch_stream_over_http_gives_the_gke_layout(
    root: Path, repo_files: dict[str, str]
) -> None:
    result = ok(run_installer(env_for(root, repo_files["http"], "580"), "run"))
    machine = testinfra.get_host("local://")

    assert rpms(root) == driver_rpms(V580B)
    assert stream(root) == "580-dkms"
    repo_file = machine.file(str(root / "etc/yum.repos.d/cuda-rhel9.repo"))
    assert repo_file.is_file and "/repo" in repo_file.content_string
    assert re.search(r"INFO\s+dnf: Complete!", result.stderr)  # dnf's output is in the log

    i = inst(root)
    assert machine.file(str(i / "current")).linked_to == str(i / "versions" / V580B)
    smi = machine.file(str(i / "bin/nvidia-smi"))
    assert smi.is_file and smi.mode & 0o111
    assert machine.file(str(i / "bin/nvidia-modprobe")).mode & 0o4000
    assert os.readlink(i / "lib64/libnvidia-ml.so.1") == f"libnvidia-ml.so.{V580B}"
    assert os.readlink(i / "lib64/libcuda.so.1") == f"libcuda.so.{V580B}"
    assert sorted(p.name for p in (i / "drivers").glob("*.ko")) == [
        "nvidia-modeset.ko",
        "nvidia-uvm.ko",
        "nvidia.ko",
    ]
    extra = root / "lib/modules" / KERNEL / "extra"
    assert (extra / "nvidia.ko").is_file()
    assert (
        "extra/nvidia-uvm.ko: extra/nvidia.ko"
        in (root / "lib/modules" / KERNEL / "modules.dep").read_text()
    )
    assert not (root / "lib/modules" / KERNEL / "updates").exists()
    assert (
        machine.file(str(root / "etc/ld.so.conf.d/nvidia-driver-installer.conf")).content_string
        == f"{INSTALL_DIR_HOST}/lib64\n"
    )
    rec = record(root)
    assert (rec["version"], rec["flavour"], rec["kernel"], rec["source"]) == (
        V580B,
        "proprietary",
        KERNEL,
        "dnf",
    )
    assert (i / ".cache").read_text() == (
        f"CACHE_KERNEL_VERSION={KERNEL}\nCACHE_NVIDIA_DRIVER_VERSION={V580B}\n"
    )
    # The transaction ran against the host root, not this machine: dnf's log and history are
    # the host's, its metadata cache is in the install dir.
    assert (root / "var/log/dnf.rpm.log").is_file()
    assert list((i / "cache/dnf").glob(f"{REPO_ID}-*/repodata"))
    assert not Path(INSTALL_DIR_HOST).exists()


def test_rerun_runs_no_dnf_transaction(root: Path, repo_files: dict[str, str]) -> None:
    env = env_for(root, repo_files["file"], "580")
    ok(run_installer(env, "run"))
    db_before = _tree(root / "root/.rpmdb") or _tree(root / "var/lib/rpm")
    before = rpms(root)
    dnf_log = (root / "var/log/dnf.log").read_text()
    second = ok(run_installer(env, "run"))
    assert "every step was already satisfied" in second.stderr
    assert not re.search(r"INFO\s+dnf: ", second.stderr)  # no dnf output: dnf never ran
    assert "step install-driver-packages: already satisfied" in second.stderr
    assert rpms(root) == before
    assert (_tree(root / "root/.rpmdb") or _tree(root / "var/lib/rpm")) == db_before
    assert (root / "var/log/dnf.log").read_text() == dnf_log  # dnf did not even start
    plan = ok(run_installer(env, "plan"))
    assert "source: dnf" in plan.stdout
    assert re.search(r"install-driver-packages\s+satisfied", plan.stdout)
    assert re.search(r"populate-install-dir\s+satisfied", plan.stdout)


def _tree(path: Path) -> dict[str, int]:
    if not path.is_dir():
        return {}
    return {p.name: p.stat().st_mtime_ns for p in path.iterdir() if not p.name.endswith("-shm")}


def test_exact_version_is_pinned_within_its_branch_stream(
    root: Path, repo_files: dict[str, str]
) -> None:
    ok(run_installer(env_for(root, repo_files["file"], V580A), "run"))
    assert rpms(root) == driver_rpms(V580A)
    assert stream(root) == "580-dkms"
    assert os.readlink(inst(root) / "current") == f"versions/{V580A}"
    # Then up to the newest of the stream, and back down: one transaction each.
    ok(run_installer(env_for(root, repo_files["file"], V580B), "run"))
    assert rpms(root) == driver_rpms(V580B)
    ok(run_installer(env_for(root, repo_files["file"], V580A), "run"))
    assert rpms(root) == driver_rpms(V580A)
    assert record(root)["version"] == V580A


def test_latest_alias_uses_the_latest_stream(root: Path, repo_files: dict[str, str]) -> None:
    result = ok(run_installer(env_for(root, repo_files["file"], "latest"), "run"))
    assert stream(root) == "latest-dkms"
    assert rpms(root) == driver_rpms(V580B)
    # The stream decides the version, not the catalog's newest (which the repo lacks).
    assert record(root)["version"] == V580B
    assert "latest-dkms" in result.stderr


def test_switching_flavour_switches_stream_in_one_transaction(
    root: Path, repo_files: dict[str, str]
) -> None:
    ok(run_installer(env_for(root, repo_files["file"], "580"), "run"))
    ok(run_installer(env_for(root, repo_files["file"], "580", "open"), "run"))
    assert stream(root) == "580-open"
    assert rpms(root) == driver_rpms(V580B, "kmod-nvidia-open-dkms")
    i = inst(root)
    assert os.readlink(i / "drivers") == f"cache/modules/{V580B}/{KERNEL}/open"
    assert record(root)["flavour"] == "open"
    history = (root / "var/log/dnf.rpm.log").read_text()
    assert "kmod-nvidia-latest-dkms" in history and "Erase" in history


def test_missing_kernel_devel_names_package_kernel_and_repo(
    root: Path, repo_files: dict[str, str]
) -> None:
    other = "6.1.0-99.el9.x86_64"
    env = env_for(root, repo_files["file"], "580", NVIDIA_KERNEL_RELEASE=other)
    result = run_installer(env, "run")
    assert result.returncode == 30, result.stderr[-3000:]
    assert "error[kernel-headers-missing]" in result.stderr
    assert f"kernel-devel-{other}" in result.stderr
    assert f"kernel {other}" in result.stderr
    assert REPO_ID in result.stderr
    assert rpms(root) == []


@pytest.mark.parametrize("which", ["dead", "nowhere"])
def test_unreachable_repo_is_repo_unavailable(
    root: Path, repo_files: dict[str, str], which: str
) -> None:
    result = run_installer(env_for(root, repo_files[which], "580"), "run")
    assert result.returncode == 51, result.stderr[-3000:]
    assert "error[repo-unavailable]" in result.stderr
    assert rpms(root) == []
    assert not (inst(root) / "current").exists()


def test_failed_transaction_leaves_the_host_packages_as_they_were(
    root: Path, repo_files: dict[str, str]
) -> None:
    ok(run_installer(env_for(root, repo_files["file"], "580"), "run"))
    before = rpms(root)
    # 575's packages both ship /usr/bin/nvidia-smi: dnf's test transaction refuses them.
    result = run_installer(env_for(root, repo_files["file"], "575"), "run")
    assert result.returncode == 50, result.stderr[-3000:]
    assert "error[package-transaction-failed]" in result.stderr
    assert "conflicts" in result.stderr
    assert rpms(root) == before
    assert stream(root) == "580-dkms"
    assert os.readlink(inst(root) / "current") == f"versions/{V580B}"
    assert not (inst(root) / "versions" / V575).exists()
