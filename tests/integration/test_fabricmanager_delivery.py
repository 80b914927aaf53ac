"""`installer run` on an HGX host root (H100 GPUs, NVSwitch functions): Fabric Manager of the
driver's exact version from NVIDIA's redist layout served on 127.0.0.1 (a mirror first),
verified against the SHA-256 its redistrib JSON lists, installed into versions/<ver>/, cached,
and pruned with its version; an archive of another version or with other bytes is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import kit
import pytest
from kit.fabricmanager import archive_name, build_fabricmanager, relative_path
from lib.hostkit import INSTALL_DIR_HOST, installer_env, make_debian_host, run_installer
from lib.hosttrees import CLASS_BRIDGE, add_pci_device
from lib.httpfaults import serve_directory
from lib.marks import needs_headers

pytestmark = needs_headers

A = "580.105.08"
B = "580.126.20"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, list[str]]]:
    """Runfiles; NVIDIA's redist tree (A, B); a mirror with A's JSON but not its archive; a tree
    whose A archive holds B's daemon; one whose A archive is not the listed bytes."""
    www = tmp_path_factory.mktemp("www")
    for version in (A, B):
        kit.build_runfile(version, www / version)
        build_fabricmanager(version, www / "redist")
    (www / "mirror").mkdir()
    shutil.copy2(www / "redist" / f"redistrib_{A}.json", www / "mirror")
    build_fabricmanager(A, www / "wrong", reports=B)
    build_fabricmanager(A, www / "tampered")
    tampered = www / "tampered" / relative_path(A)
    tampered.write_bytes(tampered.read_bytes() + b"\0")
    with serve_directory(www) as (base, requests):
        yield base, www, requests


def env_for(root: Path, kernel: str, served: tuple[str, Path, list[str]], version: str,
            redist: str) -> dict[str, str]:
    base = served[0]
    return installer_env(root, kernel, NVIDIA_DRIVER_VERSION=version,
                         NVIDIA_DRIVER_MIRRORS=base,
                         NVIDIA_FABRICMANAGER_REDIST=",".join(f"{base}/{r}"
                                                              for r in redist.split(",")))


def hgx_host(root: Path) -> str:
    kernel = make_debian_host(root, gpus=(0x2330, 0x2330))
    add_pci_device(root, "0000:05:00.0", device=0x22A3, klass=CLASS_BRIDGE)
    add_pci_device(root, "0000:06:00.0", device=0x22A3, klass=CLASS_BRIDGE)
    return kernel


@pytest.fixture(scope="module")
def built_modules(tmp_path_factory: pytest.TempPathFactory,
                  served: tuple[str, Path, list[str]]) -> Path:
    """A's modules, compiled once (Fabric Manager left out) for every test's module cache."""
    root = tmp_path_factory.mktemp("build") / "host"
    kernel = hgx_host(root)
    env = env_for(root, kernel, served, A, "redist")
    ok(run_installer({**env, "NVIDIA_FABRICMANAGER": "false"}, "run"))
    return root / INSTALL_DIR_HOST.lstrip("/") / "cache" / "modules"


@pytest.fixture
def hgx(tmp_path: Path, built_modules: Path) -> tuple[Path, str]:
    root = tmp_path / "host"
    kernel = hgx_host(root)
    shutil.copytree(built_modules, root / INSTALL_DIR_HOST.lstrip("/") / "cache" / "modules")
    return root, kernel


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_fabric_manager_comes_from_the_redist_tree_into_the_version_dir(
        hgx: tuple[Path, str], served: tuple[str, Path, list[str]]) -> None:
    root, kernel = hgx
    _, www, requests = served
    env = env_for(root, kernel, served, A, "mirror,redist")
    plan = ok(run_installer(env, "plan")).stdout
    assert f"fabric-manager: {archive_name(A)}" in plan
    assert "fetch-fabricmanager" in plan and "install-fabricmanager" in plan
    requests.clear()
    result = ok(run_installer(env, "run"))
    assert "step install-fabricmanager: done" in result.stderr
    # The mirror lists A but lacks the archive: the listed archive comes from the next base.
    asked = [r for r in requests if "mirror" in r or "redist" in r]
    assert sorted(set(asked), key=asked.index) == [
        f"/mirror/redistrib_{A}.json", f"/mirror/{relative_path(A)}", f"/redist/{relative_path(A)}"]

    install = root / INSTALL_DIR_HOST.lstrip("/")
    version_dir = install / "versions" / A
    daemon = version_dir / "bin" / "nv-fabricmanager"
    assert daemon.stat().st_mode & 0o777 == 0o755
    said = subprocess.run([str(daemon), "--version"], capture_output=True, text=True, check=True)
    assert said.stdout.strip() == f"Fabric Manager version is : {A}"
    assert (version_dir / "bin" / "nvswitch-audit").is_file()
    assert (version_dir / "lib64" / "libnvfm.so.1").is_file()
    shared = version_dir / "share/nvidia/nvswitch"
    assert "DAEMONIZE=1" in (shared / "fabricmanager.cfg").read_text()  # NVIDIA's, unchanged
    assert (shared / "dgxh100_hgxh100_topology").is_file()
    assert (shared / ".fabricmanager-version").read_text() == f"{A}\n"
    assert (install / "bin" / "nv-fabricmanager").is_file()  # bin -> current/bin
    cached = install / "cache/downloads" / archive_name(A)
    record = json.loads(Path(f"{cached}.download.json").read_text())
    listed = json.loads((www / "redist" / f"redistrib_{A}.json").read_text())
    assert record["sha256"] == listed["fabricmanager"]["linux-x86_64"]["sha256"]
    assert record["verified_by"] == "pin" and cached.stat().st_mode & 0o777 == 0o600

    requests.clear()
    warm = ok(run_installer(env, "run"))
    assert "step fetch-fabricmanager: already satisfied" in warm.stderr
    assert not [r for r in requests if "mirror" in r or "redist" in r]

    ok(run_installer(env_for(root, kernel, served, B, "redist"), "run"))
    assert sorted(p.name for p in (install / "cache/downloads").glob("fabricmanager-*")) == [
        archive_name(B), f"{archive_name(B)}.download.json"]
    assert not (install / "versions" / A).exists()
    assert (install / "versions" / B / "bin" / "nv-fabricmanager").is_file()


def test_an_archive_of_another_version_is_refused_and_dropped(
        hgx: tuple[Path, str], served: tuple[str, Path, list[str]]) -> None:
    root, kernel = hgx
    result = run_installer(env_for(root, kernel, served, A, "wrong"), "run")
    assert result.returncode == 96, result.stderr[-3000:]
    assert f"error[fabricmanager-mismatch]: {archive_name(A)} holds Fabric Manager {B}, not " \
           f"{A}: it would refuse the driver" in result.stderr
    install = root / INSTALL_DIR_HOST.lstrip("/")
    assert not list((install / "cache/downloads").glob("fabricmanager-*"))
    assert not (install / "versions" / A / "bin" / "nv-fabricmanager").exists()
    assert not (install / "current").exists()  # nothing was activated


def test_bytes_other_than_the_listed_ones_are_a_checksum_mismatch(
        hgx: tuple[Path, str], served: tuple[str, Path, list[str]]) -> None:
    root, kernel = hgx
    result = run_installer(env_for(root, kernel, served, A, "tampered"), "run")
    assert result.returncode == 23, result.stderr[-3000:]
    assert "error[checksum-mismatch]" in result.stderr
    install = root / INSTALL_DIR_HOST.lstrip("/")
    assert not list((install / "cache/downloads").glob("fabricmanager-*"))
    assert not (install / "versions" / A / "bin" / "nv-fabricmanager").exists()
