"""NVLSM on an HGX B200 node of the dnf source, with the real dnf and rpm against a Rocky 9.4 host
root and the kit's signed module-stream repo (kit.rpm), which also holds NVIDIA's `nvlsm`
package in two date versions, laid out as NVIDIA's (/opt/nvidia/nvlsm/sbin/nvlsm, its plugin
under /opt/nvidia/nvlsm/lib, /usr/share/nvidia/nvlsm/*.conf): the driver's one transaction takes
the fm profile and nvlsm (the newest, or NVIDIA_NVLSM_VERSION), its files land in
versions/<ver>/ where the fabricmanager container runs them; a pin the repo lacks is refused
before any package changes."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from kit.nvlink5 import hgx_b200_ports, write_cx7_port
from kit.rpm import KERNEL, V580A, build_extras, build_repo, write_repo_file
from kit.rpm.nvlsm import VERSIONS
from lib.dnfroots import host_has_files_of, make_root
from lib.hostkit import INSTALL_DIR_HOST, installer_env, run_installer

TOOLS = ("dnf", "rpm", "rpmbuild", "rpmsign", "gpg", "createrepo_c", "modifyrepo_c", "busybox")
pytestmark = [
    pytest.mark.skipif(
        any(shutil.which(t) is None for t in TOOLS), reason="needs " + ", ".join(TOOLS)
    ),
    pytest.mark.skipif(
        not list(Path("/usr/src").glob("linux-headers-*-amd64")), reason="needs linux-headers"
    ),
]

B200 = 0x2901
OLDER, NEWEST = VERSIONS


@pytest.fixture(scope="module")
def repo_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    repo = build_repo()
    return "file://" + str(write_repo_file(tmp_path_factory.mktemp("repo") / "cuda-rhel9.repo",
                                           f"file://{repo}"))


@pytest.fixture(scope="module")
def extras() -> Path:
    return build_extras()


def b200_root(tmp_path: Path, extras: Path, repo_file: str) -> Path:
    """Rocky 9.4 with a B200 and the board's ConnectX-7 ports (mlx5_ib loaded: their IB
    devices, a Limited PF among them), and the key `repo_file` names."""
    root = make_root(tmp_path, extras, gpus=(B200,))
    host_has_files_of(root, Path(repo_file[len("file://"):]))
    for port in hgx_b200_ports():
        write_cx7_port(root, port)
    return root


def run(root: Path, repo_file: str, *args: str, **settings: str
        ) -> subprocess.CompletedProcess[str]:
    env = installer_env(root, KERNEL, NVIDIA_DRIVER_VERSION=V580A,
                        NVIDIA_KERNEL_MODULE_TYPE="open", NVIDIA_DNF_REPO_URL=repo_file,
                        NVIDIA_INSTALLER_RETRIES="1", **settings)
    return run_installer(env, *args, timeout=900)


def rpm_q(root: Path, *args: str) -> str:
    return subprocess.run(["rpm", "--root", str(root), *args], capture_output=True, text=True,
                          check=True).stdout


def test_a_b200_on_rocky_gets_nvlsm_in_the_drivers_transaction(
    tmp_path: Path, extras: Path, repo_file: str
) -> None:
    root = b200_root(tmp_path, extras, repo_file)
    plan = run(root, repo_file, "plan")
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert re.search(r"nvlink5\s*:?\s+yes", plan.stdout), plan.stdout
    assert ("NVLSM: NVIDIA's package nvlsm (the host's, else the repo's newest) from the host's "
            "NVIDIA repo") in plan.stdout, plan.stdout
    steps = plan.stdout[plan.stdout.index("steps:"):]
    assert steps.index("install-fabricmanager") < steps.index("install-nvlsm"), steps
    result = run(root, repo_file, "run", "-v")
    assert result.returncode == 0, result.stderr[-4000:]
    # One transaction: the fm profile, Fabric Manager pinned, nvlsm beside them.
    transaction = [line for line in result.stderr.splitlines()
                   if re.search(r"run: dnf .* install --allowerasing", line)]
    assert len(transaction) == 1, result.stderr[-4000:]
    assert "@nvidia-driver:580-open/fm" in transaction[0].split(), transaction[0]
    assert transaction[0].split()[-5:-2] == [
        f"kmod-nvidia-open-dkms-{V580A}", f"nvidia-fabricmanager-{V580A}", "nvlsm"], transaction[0]
    assert not re.search(r"run: dnf .* install nvlsm", result.stderr)  # no second transaction
    assert rpm_q(root, "-q", "--qf", "%{VERSION}-%{RELEASE}", "nvlsm") == f"{NEWEST}-1"
    version_dir = root / INSTALL_DIR_HOST.lstrip("/") / "versions" / V580A
    daemon = version_dir / "bin/nvlsm"
    assert daemon.read_bytes() == (root / "opt/nvidia/nvlsm/sbin/nvlsm").read_bytes()
    assert daemon.stat().st_mode & 0o777 == 0o755
    said = subprocess.run([str(daemon), "--version"], capture_output=True, text=True).stdout
    assert said.strip() == f"nvlsm {NEWEST}"
    assert (version_dir / "lib64/libgrpc_mgr.so").read_bytes() == (
        root / "opt/nvidia/nvlsm/lib/libgrpc_mgr.so").read_bytes()
    share = version_dir / "share/nvidia/nvlsm"
    assert sorted(p.name for p in share.iterdir()) == [
        ".nvlsm-version", "device_configuration.conf", "grpc_mgr.conf", "nvlsm.conf"]
    # nvlsm.conf names the plugin's config by the package's path: pointed at this copy.
    assert f"--config_file {share}/grpc_mgr.conf\n" in (share / "nvlsm.conf").read_text()
    digest = hashlib.sha256(daemon.read_bytes()).hexdigest()  # what the package vouched for
    assert (share / ".nvlsm-version").read_text() == f"{NEWEST}\n{digest}\n"
    assert "step install-nvlsm: " in result.stderr
    # A second run finds it in place: no dnf, no copy.
    again = run(root, repo_file, "run", "-v")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "step install-nvlsm: already satisfied" in again.stderr
    assert not re.search(r"run: dnf ", again.stderr)


def test_a_pinned_nvlsm_is_installed_and_one_the_repo_lacks_changes_nothing(
    tmp_path: Path, extras: Path, repo_file: str
) -> None:
    root = b200_root(tmp_path, extras, repo_file)
    missing = run(root, repo_file, "run", NVIDIA_NVLSM_VERSION="2024.01.1")
    assert missing.returncode == 47, missing.stderr[-4000:]
    assert "error[nvlsm-package-unavailable]: this NVLink5 node needs NVLSM, but dnf found no " \
        "such package in the host's repos" in missing.stderr
    assert "No match for argument: nvlsm-2024.01.1" in missing.stderr
    assert "hint: On dnf hosts NVLSM comes from NVIDIA's `nvlsm` package" in missing.stderr
    installed = rpm_q(root, "-qa", "--qf", "%{NAME}\\n").split()
    assert not [n for n in installed if n.startswith(("nvidia", "kmod", "nvlsm"))], installed
    pinned = run(root, repo_file, "run", NVIDIA_NVLSM_VERSION=OLDER)
    assert pinned.returncode == 0, pinned.stderr[-4000:]
    assert rpm_q(root, "-q", "--qf", "%{VERSION}", "nvlsm") == OLDER
    marker = (root / INSTALL_DIR_HOST.lstrip("/") / "versions" / V580A
              / "share/nvidia/nvlsm/.nvlsm-version").read_text()
    assert marker.splitlines()[0] == OLDER
