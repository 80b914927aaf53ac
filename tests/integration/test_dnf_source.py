"""`installer run` with the dnf source end to end: the real dnf and rpm against Rocky 9.4 and 8.9
host roots with an initialised rpm database, a module-stream repo of the fake driver built by
kit.rpm (DKMS and precompiled streams, packages shaped like NVIDIA's and signed, the .repo files
saying gpgcheck=1 and naming the key as NVIDIA's do), served from file:// and https://127.0.0.1,
and a stand-in EPEL repo with dkms. rpm runs the packages' scriptlets chrooted
into the root, which gets a shell from the kit's `kit-base` package first. Nothing is loaded
here: the host root's running kernel differs from the kernel the packages are for (building
ahead: DKMS's %post builds for `uname -r` and fails, swallowed, so the installer's `dkms install
-k` does the work), as in test_run_runfile."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import testinfra
from kit.rpm import (
    KERNEL,
    KERNEL8,
    SIGNER,
    SIGNING_KEY,
    V565,
    V575,
    V580A,
    V580B,
    build_extras,
    build_repo,
    precompiled_kmod,
    write_repo_file,
)
from lib.dnfroots import host_has_files_of, make_root
from lib.hostkit import GCC_LINE, INSTALL_DIR_HOST, installer_env, ok, run_installer
from lib.hosttrees import CLASS_BRIDGE, add_pci_device
from lib.tlskit import serve_directory_tls

from installer.components.fabricmanager_daemon import FabricManagerDaemon
from installer.components.supervisor import Driver
from installer.config import build_config
from installer.hostroot import HostRoot

TOOLS = ("dnf", "rpm", "rpmbuild", "rpmsign", "gpg", "openssl", "createrepo_c", "modifyrepo_c",
         "makeself", "busybox")
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
def extras() -> Path:
    return build_extras()


@pytest.fixture(scope="module")
def repo_files(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """URLs of .repo files: the repo over file://, over https://127.0.0.1 (`ca`: the server's
    certificate, trusted through REQUESTS_CA_BUNDLE and sslcacert=), and a dead server."""
    www = tmp_path_factory.mktemp("www")
    os.symlink(repo, www / "repo")
    with serve_directory_tls(www, tmp_path_factory.mktemp("tls")) as served:
        yield _repo_urls(www, repo, served.base, served.ca)


def _repo_urls(www: Path, repo: Path, base: str, ca: Path) -> dict[str, str]:
    write_repo_file(www / "cuda-rhel9.repo", f"{base}/repo", REPO_ID, sslcacert=ca)
    local = write_repo_file(www / "file" / "cuda-rhel9.repo", f"file://{repo}", REPO_ID)
    dead = write_repo_file(
        www / "dead" / "cuda-rhel9.repo", f"https://127.0.0.1:{_closed_port()}/r", REPO_ID
    )
    return {
        "www": str(www),
        "https": f"{base}/cuda-rhel9.repo",
        "ca": str(ca),
        "file": f"file://{local}",
        "dead": f"file://{dead}",
        "nowhere": f"https://127.0.0.1:{_closed_port()}/cuda-rhel9.repo",
    }


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def root(tmp_path: Path, extras: Path, repo_files: dict[str, str]) -> Path:
    host = make_root(tmp_path, extras)
    # The repo files name the kit's key and the test CA by their paths here: the host has them.
    host_has_files_of(host, *(Path(url[len("file://"):]) for key, url in repo_files.items()
                              if key in ("file", "dead")),
                      Path(repo_files["www"]) / "cuda-rhel9.repo")
    return host


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



def rpms(root: Path) -> list[str]:
    out = subprocess.run(
        ["rpm", "--root", str(root), "-qa", "--qf", "%{NAME}-%{VERSION}\\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # gpg-pubkey-<id>: the repo's signing key, which dnf imported into the rpm database.
    return sorted(n for n in out.split() if not n.startswith(("kit-base-", "gpg-pubkey-")))


def imported_keys(root: Path) -> list[str]:
    out = subprocess.run(["rpm", "--root", str(root), "-q", "gpg-pubkey", "--qf",
                          "%{SUMMARY}\\n"], capture_output=True, text=True)
    return out.stdout.split("\n")[:-1] if out.returncode == 0 else []


def stream(root: Path) -> str:
    text = (root / "etc/dnf/modules.d/nvidia-driver.module").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)["stream"]


def inst(root: Path) -> Path:
    return root / INSTALL_DIR_HOST.lstrip("/")


def record(root: Path) -> dict[str, Any]:
    return dict(json.loads((inst(root) / "state.json").read_text()))


def driver_rpms(
    version: str, kmod: str = "kmod-nvidia-latest-dkms", kernel: str = KERNEL
) -> list[str]:
    """What the host has after a DKMS stream: with kernel-devel and dkms; a precompiled kmod
    (kmod=None-like name starting kmod-nvidia-<v>-) comes alone."""
    userspace = [f"nvidia-driver-{version}", f"nvidia-driver-cuda-{version}",
                 f"nvidia-modprobe-{version}", f"{kmod}-{version}"]
    if not kmod.endswith("-dkms"):
        return sorted(userspace)
    return sorted(
        [
            *userspace,
            "dkms-3.0.13",
            f"kernel-devel-{kernel.split('-')[0]}",
            f"kernel-headers-{kernel.split('-')[0]}",
        ]
    )


def test_dkms_stream_over_https_builds_with_dkms_and_gives_the_gke_layout(
    root: Path, repo_files: dict[str, str]
) -> None:
    # 580.105.08 has no precompiled kmod: the 580-dkms stream, DKMS builds for KERNEL.
    env = env_for(root, repo_files["https"], V580A, REQUESTS_CA_BUNDLE=repo_files["ca"])
    result = ok(run_installer(env, "run"))
    machine = testinfra.get_host("local://")

    assert rpms(root) == driver_rpms(V580A)
    # The packages were signature-checked against the key the .repo named (fetched over TLS).
    assert imported_keys(root) == [f"{SIGNER} public key"]
    assert stream(root) == "580-dkms"
    assert "DKMS stream 580-dkms" in result.stderr
    assert re.search(r"INFO\s+dnf: Complete!", result.stderr)  # dnf's output is in the log
    # The package owns sources only; DKMS (run by the installer for KERNEL) made the modules,
    # xz-compressed as EL9's kernel config asks, in extra/, owned by no package.
    owned = subprocess.run(["rpm", "--root", str(root), "-ql", "kmod-nvidia-latest-dkms"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert f"/usr/src/nvidia-{V580A}/dkms.conf" in owned
    assert not [f for f in owned if f.startswith("/lib/modules")]
    assert f"DKMS has not installed nvidia {V580A} for {KERNEL}: dkms install" in result.stderr
    extra = root / "lib/modules" / KERNEL / "extra"
    assert sorted(p.name for p in extra.iterdir()) == [
        "nvidia-modeset.ko.xz", "nvidia-uvm.ko.xz", "nvidia.ko.xz"]
    assert (root / f"var/lib/dkms/nvidia/{V580A}/build/make.log").is_file()
    assert (root / f"var/lib/dkms/nvidia/{V580A}/{KERNEL}/x86_64/module/nvidia.ko").is_file()
    assert "extra/nvidia-uvm.ko.xz: extra/nvidia.ko.xz" in (
        root / "lib/modules" / KERNEL / "modules.dep").read_text()

    i = inst(root)
    assert machine.file(str(i / "current")).linked_to == str(i / "versions" / V580A)
    smi = machine.file(str(i / "bin/nvidia-smi"))
    assert smi.is_file and smi.mode & 0o111
    assert machine.file(str(i / "bin/nvidia-modprobe")).mode & 0o4000
    assert os.readlink(i / "lib64/libnvidia-ml.so.1") == f"libnvidia-ml.so.{V580A}"
    assert os.readlink(i / "lib64/libcuda.so.1") == f"libcuda.so.{V580A}"
    drivers = sorted((i / "drivers").glob("*.ko"))
    assert [p.name for p in drivers] == ["nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]
    assert (i / "drivers/nvidia.ko").read_bytes()[:4] == b"\x7fELF"  # uncompressed
    assert not (root / "lib/modules" / KERNEL / "updates").exists()
    assert (
        machine.file(str(root / "etc/ld.so.conf.d/nvidia-driver-installer.conf")).content_string
        == f"{INSTALL_DIR_HOST}/lib64\n"
    )
    rec = record(root)
    assert (rec["version"], rec["flavour"], rec["kernel"], rec["source"]) == (
        V580A, "proprietary", KERNEL, "dnf")
    assert (root / "var/log/dnf.rpm.log").is_file()
    assert list((i / "cache/dnf").glob(f"{REPO_ID}-*/repodata"))
    assert not Path(INSTALL_DIR_HOST).exists()


def test_precompiled_stream_is_preferred_for_a_kernel_nvidia_built_for(
    root: Path, repo_files: dict[str, str]
) -> None:
    env = env_for(root, repo_files["file"], "580")
    result = ok(run_installer(env, "run"))
    kmod = precompiled_kmod(V580B, KERNEL)
    assert rpms(root) == sorted(
        [f"nvidia-driver-{V580B}", f"nvidia-driver-cuda-{V580B}", f"nvidia-modprobe-{V580B}",
         f"{kmod}-{V580B}"])
    assert stream(root) == "580"
    assert f"precompiled stream 580: NVIDIA ships {kmod}" in result.stderr
    assert "dkms" not in " ".join(rpms(root)) and "kernel-devel" not in " ".join(rpms(root))
    ghosts = root / "lib/modules" / KERNEL / "extra/drivers/video/nvidia"
    assert sorted(p.name for p in ghosts.iterdir()) == [
        "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]
    i = inst(root)
    assert sorted(p.name for p in (i / "drivers").glob("*.ko")) == [
        "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]
    assert record(root)["version"] == V580B
    # The plan, now that dnf's metadata is cached, names the stream and the version dnf installs.
    plan = ok(run_installer(env_for(root, repo_files["file"], "latest"), "plan"))
    assert re.search(r"dnf-stream\s*:?\s+nvidia-driver:latest", plan.stdout), plan.stdout
    assert re.search(rf"version\s*:?\s+{V580B}", plan.stdout), plan.stdout


def test_rerun_runs_no_dnf_transaction_and_no_dkms(root: Path, repo_files: dict[str, str]) -> None:
    env = env_for(root, repo_files["file"], V580A)
    ok(run_installer(env, "run"))
    db_before = _tree(root / "root/.rpmdb") or _tree(root / "var/lib/rpm")
    before = rpms(root)
    dnf_log = (root / "var/log/dnf.log").read_text()
    second = ok(run_installer(env, "run"))
    assert "every step was already satisfied" in second.stderr
    assert not re.search(r"INFO\s+dnf: ", second.stderr)  # no dnf output: dnf never ran
    assert "dkms install" not in second.stderr and "DKMS has" not in second.stderr
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


def test_rocky8_dkms_without_precompiled_kmod_and_uncompressed_modules(
    tmp_path: Path, extras: Path, repo_files: dict[str, str]
) -> None:
    root = make_root(tmp_path, extras, major=8)
    host_has_files_of(root, Path(repo_files["file"][len("file://"):]))
    env = env_for(root, repo_files["file"], "580")
    env["NVIDIA_KERNEL_RELEASE"] = KERNEL8
    result = ok(run_installer(env, "run"))
    assert rpms(root) == driver_rpms(V580B, kernel=KERNEL8)
    assert stream(root) == "580-dkms"
    assert f"NVIDIA ships no precompiled kmod of {V580B} for kernel {KERNEL8}" in result.stderr
    extra = root / "lib/modules" / KERNEL8 / "extra"
    assert sorted(p.name for p in extra.iterdir()) == [
        "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]
    assert record(root)["version"] == V580B


def test_exact_pins_and_upgrades_across_branches_and_flavours(
    root: Path, repo_files: dict[str, str]
) -> None:
    ok(run_installer(env_for(root, repo_files["file"], V580A), "run"))
    assert rpms(root) == driver_rpms(V580A)
    # Up to 580's newest: precompiled for this kernel, so the DKMS kmod and its build go.
    ok(run_installer(env_for(root, repo_files["file"], V580B), "run"))
    kmod = precompiled_kmod(V580B, KERNEL)
    assert stream(root) == "580"
    assert f"{kmod}-{V580B}" in rpms(root) and "kmod-nvidia-latest-dkms" not in str(rpms(root))
    assert not (root / f"var/lib/dkms/nvidia/{V580A}").exists()  # %preun: dkms remove --all
    assert not list((root / "lib/modules" / KERNEL / "extra").glob("*.ko.xz"))
    # Then the open flavour: DKMS stream 580-open, one transaction. From 570.148.08 NVIDIA's
    # open kmod registers with DKMS as nvidia, like the proprietary one (before: nvidia-open).
    result = ok(run_installer(env_for(root, repo_files["file"], "580", "open"), "run"))
    assert stream(root) == "580-open"
    assert rpms(root) == driver_rpms(V580B, "kmod-nvidia-open-dkms")
    conf = root / f"usr/src/nvidia-{V580B}/dkms.conf"
    assert 'PACKAGE_NAME="nvidia"' in conf.read_text()
    assert not (root / f"usr/src/nvidia-open-{V580B}").exists()
    assert f"DKMS has not installed nvidia {V580B} for {KERNEL}: dkms install" in result.stderr
    assert (root / f"var/lib/dkms/nvidia/{V580B}/{KERNEL}/x86_64/module/nvidia.ko").is_file()
    status = subprocess.run(["chroot", str(root), "dkms", "status", "-m", "nvidia", "-k",
                             KERNEL], capture_output=True, text=True, check=True).stdout
    assert status == f"nvidia/{V580B}, {KERNEL}, x86_64: installed\n"
    i = inst(root)
    assert os.readlink(i / "drivers") == f"cache/modules/{V580B}/{KERNEL}/open"
    assert record(root)["flavour"] == "open"


def test_dkms_build_failure_undoes_the_transaction(
    root: Path, repo_files: dict[str, str]
) -> None:
    result = run_installer(env_for(root, repo_files["file"], V565), "run")
    assert result.returncode == 31, result.stderr[-3000:]
    assert "error[module-build-failed]" in result.stderr
    assert f"/var/lib/dkms/nvidia/{V565}/build/make.log" in result.stderr
    assert "No rule to make target" in result.stderr  # make.log's tail
    assert rpms(root) == []  # kernel-devel, dkms and the driver all undone
    assert not (inst(root) / "current").exists()
    assert not list((root / "lib/modules" / KERNEL).rglob("nvidia*"))


def test_open_dkms_build_failure_names_nvidia_open_and_its_make_log(
    root: Path, repo_files: dict[str, str]
) -> None:
    """The open flavour's DKMS module is nvidia-open before 570.148.08 (nvidia from then on): a
    565 failure quotes that module's make.log (asking DKMS for `nvidia` would fail with "Could
    not find module source directory")."""
    ok(run_installer(env_for(root, repo_files["file"], V580A, "open"), "run"))
    before = rpms(root)
    result = run_installer(env_for(root, repo_files["file"], V565, "open"), "run")
    assert result.returncode == 31, result.stderr[-3000:]
    assert "error[module-build-failed]" in result.stderr
    assert f"DKMS could not build nvidia-open {V565} for kernel {KERNEL}" in result.stderr
    assert f"/var/lib/dkms/nvidia-open/{V565}/build/make.log" in result.stderr
    assert "No rule to make target" in result.stderr
    assert "Could not find module source directory" not in result.stderr
    assert rpms(root) == before
    assert stream(root) == "580-open"
    assert (root / f"var/lib/dkms/nvidia/{V580A}/{KERNEL}/x86_64/module/nvidia.ko").is_file()
    assert os.readlink(inst(root) / "current") == f"versions/{V580A}"


def test_dkms_failure_on_an_upgrade_puts_the_old_driver_back(
    root: Path, repo_files: dict[str, str]
) -> None:
    ok(run_installer(env_for(root, repo_files["file"], V580A), "run"))
    before = rpms(root)
    extra = sorted(p.name for p in (root / "lib/modules" / KERNEL / "extra").iterdir())
    result = run_installer(env_for(root, repo_files["file"], V565), "run")
    assert result.returncode == 31, result.stderr[-3000:]
    assert rpms(root) == before
    assert stream(root) == "580-dkms"
    assert sorted(p.name for p in (root / "lib/modules" / KERNEL / "extra").iterdir()) == extra
    assert (root / f"var/lib/dkms/nvidia/{V580A}/{KERNEL}/x86_64/module/nvidia.ko").is_file()
    assert os.readlink(inst(root) / "current") == f"versions/{V580A}"
    assert not (inst(root) / "versions" / V565).exists()


def test_without_epel_dkms_is_named_before_any_change(
    tmp_path: Path, extras: Path, repo_files: dict[str, str]
) -> None:
    root = make_root(tmp_path, extras, epel=False)
    result = run_installer(env_for(root, repo_files["file"], V580A), "run")
    assert result.returncode == 52, result.stderr[-3000:]
    assert "error[dkms-unavailable]" in result.stderr and "EPEL" in result.stderr
    assert "NVIDIA_DNF_ENABLE_EPEL" in result.stderr
    assert rpms(root) == []


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
    ok(run_installer(env_for(root, repo_files["file"], V580A), "run"))
    before = rpms(root)
    # 575's packages both ship /usr/bin/nvidia-smi: dnf's test transaction refuses them.
    result = run_installer(env_for(root, repo_files["file"], "575"), "run")
    assert result.returncode == 50, result.stderr[-3000:]
    assert "error[package-transaction-failed]" in result.stderr
    assert "conflicts" in result.stderr
    assert rpms(root) == before
    assert stream(root) == "580-dkms"
    assert os.readlink(inst(root) / "current") == f"versions/{V580A}"
    assert not (inst(root) / "versions" / V575).exists()


def test_a_held_driver_is_refused_before_the_packages_change(
    root: Path, repo_files: dict[str, str]
) -> None:
    """dnf replaces the host's user space as it installs: with driver A loaded and held, an
    upgrade to B must not run a transaction (A's kernel module under B's libraries)."""
    from lib.hosttrees import (
        add_process,
        module_line,
        write_driver_version,
        write_osrelease_kernel,
        write_proc_modules,
    )

    ok(run_installer(env_for(root, repo_files["file"], V580A), "run"))  # built ahead, A
    before = rpms(root)
    # Now the host runs that kernel with A loaded; the device plugin holds /dev/nvidia0.
    write_osrelease_kernel(root, KERNEL)
    (root / "proc/version").write_text(GCC_LINE.format(k=KERNEL))
    write_proc_modules(root, [module_line("nvidia_uvm"), module_line("nvidia", refcount=1)])
    write_driver_version(root, V580A)
    add_process(root, 4242, "nvidia-device-p", {3: "/dev/nvidia0"})
    result = run_installer(env_for(root, repo_files["file"], V580B), "run")
    assert result.returncode == 34, result.stderr[-3000:]
    assert rpms(root) == before
    assert "step install-driver-packages" not in result.stderr
    assert "error[driver-in-use]" in result.stderr
    assert "pid 4242 (nvidia-device-p) holds /dev/nvidia0" in result.stderr
    assert "driver packages were left as they were" in result.stderr
    assert stream(root) == "580-dkms"
    assert os.readlink(inst(root) / "current") == f"versions/{V580A}"


def test_an_nvswitch_node_gets_fabric_manager_from_the_streams_fm_profile(
    root: Path, repo_files: dict[str, str]
) -> None:
    """HGX H100 on Rocky 9: the driver's one transaction takes profile fm with NVIDIA's Fabric
    Manager package of the same version; its files land in versions/<ver>/, where `installer
    fabricmanager` runs them; `dnf module remove --all nvidia-driver` takes it away again."""
    for address in ("0000:05:00.0", "0000:06:00.0"):  # HGX H100's NVSwitches
        add_pci_device(root, address, device=0x22A3, klass=CLASS_BRIDGE)
    env = env_for(root, repo_files["file"], V580A)
    plan = ok(run_installer(env, "plan"))
    assert re.search(r"fabric-manager\s*:?\s+the stream's fm profile", plan.stdout), plan.stdout
    result = ok(run_installer(env, "run"))
    fm = "nvidia-fabricmanager"  # NVIDIA's name from the 580 branch on
    assert rpms(root) == sorted([*driver_rpms(V580A), f"{fm}-{V580A}"])
    assert "profiles=fm" in (root / "etc/dnf/modules.d/nvidia-driver.module").read_text()
    assert "install-fabricmanager" in result.stderr
    query = ["rpm", "--root", str(root)]
    assert subprocess.run([*query, "-q", "--qf", "%{EPOCH}:%{VERSION}-%{RELEASE}", fm],
                          capture_output=True, text=True, check=True).stdout == (
        f"(none):{V580A}-1")
    owned = subprocess.run([*query, "-ql", fm], capture_output=True, text=True,
                           check=True).stdout.split()
    assert owned == ["/usr/bin/nv-fabricmanager", "/usr/bin/nvswitch-audit",
                     "/usr/lib/systemd/system/nvidia-fabricmanager.service",
                     "/usr/share/nvidia/nvswitch/dgx2_hgx2_topology",
                     "/usr/share/nvidia/nvswitch/dgxa100_hgxa100_topology",
                     "/usr/share/nvidia/nvswitch/dgxh100_hgxh100_topology",
                     "/usr/share/nvidia/nvswitch/dgxh800_hgxh800_topology",
                     "/usr/share/nvidia/nvswitch/fabricmanager.cfg"]
    version_dir = inst(root) / "versions" / V580A
    daemon = version_dir / "bin/nv-fabricmanager"
    assert daemon.read_bytes() == (root / "usr/bin/nv-fabricmanager").read_bytes()
    said = subprocess.run([str(daemon), "--version"], capture_output=True, text=True).stdout
    assert f"Fabric Manager version is : {V580A}" in said
    nvswitch = version_dir / "share/nvidia/nvswitch"
    digest = hashlib.sha256(daemon.read_bytes()).hexdigest()  # what the package vouched for
    assert (nvswitch / ".fabricmanager-version").read_text() == f"{V580A}\n{digest}\n"
    assert (nvswitch / "fabricmanager.cfg").read_bytes() == (
        root / "usr/share/nvidia/nvswitch/fabricmanager.cfg").read_bytes()
    # The fabricmanager container's plan for this driver: the copy in the install dir.
    config = build_config(env, {})
    supervised = FabricManagerDaemon(config, HostRoot(root), env={})
    try:
        start = supervised.plan(Driver(V580A, PurePosixPath(INSTALL_DIR_HOST)))
        assert callable(start)
        rendered = (supervised.work / "fabricmanager.cfg").read_text()
        assert f"TOPOLOGY_FILE_PATH={nvswitch}" in rendered and "DAEMONIZE=0" in rendered
    finally:
        supervised.close()
    # A second run finds everything in place: no transaction, no copy.
    again = ok(run_installer(env, "run"))
    assert "every step was already satisfied" in again.stderr
    assert "step install-fabricmanager: already satisfied" in again.stderr
    assert not re.search(r"INFO\s+dnf: ", again.stderr)
    # What `installer uninstall` tells the operator to run removes it with the driver.
    subprocess.run(["dnf", f"--installroot={root}", "--releasever=9.4",
                    f"--setopt=reposdir={root}/etc/yum.repos.d",
                    f"--setopt=cachedir={inst(root)}/cache/dnf",
                    "--setopt=module_platform_id=platform:el9", "--disableplugin=local", "-y",
                    "module", "remove", "--all", "nvidia-driver"],
                   capture_output=True, text=True, check=True)
    assert not [name for name in rpms(root) if "fabric" in name or "nvidia-driver" in name]


# --- hostile .repo files: refused before anything reaches /etc/yum.repos.d ----------------------


def repos_dir(root: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((root / "etc/yum.repos.d").iterdir())}


HOSTILE_REPOS = {
    # (what the mirror changed in NVIDIA's file, what the error must say)
    "gpgcheck-off": (lambda t: t.replace("gpgcheck=1", "gpgcheck=0"), "has gpgcheck=0"),
    "extra-section": (lambda t: t + "[evil]\nname=evil\nbaseurl=https://127.0.0.1:1/evil\n"
                      "enabled=1\ngpgcheck=0\n", "defines 2 repos ([cuda-rhel9-x86_64], [evil])"),
    "http-baseurl": (lambda t: re.sub(r"baseurl=https://", "baseurl=http://", t),
                     "has baseurl=http://127.0.0.1"),
    "no-gpgkey": (lambda t: re.sub(r"gpgkey=.*\n", "", t), "names no signing key (gpgkey=)"),
    "http-gpgkey": (lambda t: t.replace("gpgkey=https://", "gpgkey=http://"),
                    "has gpgkey=http://127.0.0.1"),
}


@pytest.fixture(scope="module")
def hostile(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A mirror on https://127.0.0.1 serving NVIDIA's .repo file as each case changed it."""
    www = tmp_path_factory.mktemp("hostile")
    os.symlink(repo, www / "repo")
    with serve_directory_tls(www, tmp_path_factory.mktemp("hostile-tls")) as served:
        good = write_repo_file(www / "good" / "cuda-rhel9.repo", f"{served.base}/repo", REPO_ID,
                               sslcacert=served.ca).read_text()
        urls = {"ca": str(served.ca)}
        for case, (change, _said) in HOSTILE_REPOS.items():
            (www / case).mkdir()
            (www / case / "cuda-rhel9.repo").write_text(change(good))
            urls[case] = f"{served.base}/{case}/cuda-rhel9.repo"
        yield urls


@pytest.mark.parametrize("case", sorted(HOSTILE_REPOS))
def test_a_hostile_repo_file_is_refused_and_the_hosts_repos_stay_as_they_were(
    root: Path, hostile: dict[str, str], case: str
) -> None:
    before = repos_dir(root)
    env = env_for(root, hostile[case], V580A, REQUESTS_CA_BUNDLE=hostile["ca"])
    result = run_installer(env, "run")
    assert result.returncode == 63, result.stderr[-3000:]
    assert "error[repo-file-refused]" in result.stderr
    assert HOSTILE_REPOS[case][1] in result.stderr
    assert "Traceback" not in result.stderr
    assert repos_dir(root) == before  # nothing written, nothing replaced
    assert rpms(root) == [] and imported_keys(root) == []
    assert not (inst(root) / "current").exists()


def test_a_repo_file_over_plain_http_is_refused_before_it_is_fetched(
    root: Path, repo_files: dict[str, str], tmp_path: Path
) -> None:
    from lib.httpfaults import serve_directory

    www = tmp_path / "www"
    write_repo_file(www / "cuda-rhel9.repo", "https://127.0.0.1:1/repo", REPO_ID)
    before = repos_dir(root)
    with serve_directory(www) as (base, requests):
        result = run_installer(env_for(root, f"{base}/cuda-rhel9.repo", V580A), "run")
    assert result.returncode == 65, result.stderr[-3000:]
    assert "error[repo-url-insecure]" in result.stderr
    assert requests == [] and repos_dir(root) == before and rpms(root) == []


def test_the_hosts_unsigned_nvidia_repo_is_refused_not_edited(root: Path, repo: Path) -> None:
    weak = root / "etc/yum.repos.d/cuda-rhel9.repo"
    write_repo_file(weak, f"file://{repo}", REPO_ID, signed=False)
    before = repos_dir(root)
    result = run_installer(env_for(root, "", V580A, NVIDIA_DRIVER_SOURCE="dnf"), "run")
    assert result.returncode == 64, result.stderr[-3000:]
    assert "error[host-repo-insecure]" in result.stderr
    assert (f"/etc/yum.repos.d/cuda-rhel9.repo enables [{REPO_ID}] without gpgcheck=1"
            in result.stderr)
    assert repos_dir(root) == before and rpms(root) == []


def test_the_hosts_signed_repo_file_is_never_replaced_by_a_fetched_one(
    root: Path, repo: Path, hostile: dict[str, str]
) -> None:
    own = write_repo_file(root / "etc/yum.repos.d/cuda-rhel9.repo", f"file://{repo}", REPO_ID)
    before = repos_dir(root)
    env = env_for(root, hostile["gpgcheck-off"], V580A, REQUESTS_CA_BUNDLE=hostile["ca"])
    ok(run_installer(env, "run"))
    assert repos_dir(root) == before
    assert "gpgcheck=1" in own.read_text()
    assert rpms(root) == driver_rpms(V580A)
    assert imported_keys(root) == [f"{SIGNER} public key"]


def test_the_hosts_repo_naming_its_key_and_ca_as_local_files_installs(
    root: Path, repo: Path, repo_files: dict[str, str]
) -> None:
    """How EL hosts and in-house mirrors name keys: `gpgkey=file:///etc/pki/rpm-gpg/...` and
    `sslcacert=/etc/pki/...`, paths of the host. dnf --installroot reads them from this
    process's filesystem, so the transaction must reach them inside the host root, as the
    header fetch does."""
    key = root / "etc/pki/rpm-gpg/RPM-GPG-KEY-cuda"
    key.parent.mkdir(parents=True)
    shutil.copyfile(repo / SIGNING_KEY, key)
    ca = root / "etc/pki/tls/certs/mirror-ca.pem"
    ca.parent.mkdir(parents=True)
    shutil.copyfile(repo_files["ca"], ca)
    base = repo_files["https"].rsplit("/", 1)[0]
    own = root / "etc/yum.repos.d/cuda-rhel9.repo"
    write_repo_file(own, f"{base}/repo", REPO_ID)
    text = re.sub(r"gpgkey=.*", "gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-cuda",
                  own.read_text())
    own.write_text(text + "sslcacert=/etc/pki/tls/certs/mirror-ca.pem\n")
    assert not Path("/etc/pki/rpm-gpg/RPM-GPG-KEY-cuda").exists()  # only inside the root
    before = repos_dir(root)

    result = ok(run_installer(env_for(root, "", V580A, NVIDIA_DRIVER_SOURCE="dnf"), "run"))

    assert "Traceback" not in result.stderr
    assert rpms(root) == driver_rpms(V580A)
    assert imported_keys(root) == [f"{SIGNER} public key"]
    assert repos_dir(root) == before  # the host's files are read, never rewritten
