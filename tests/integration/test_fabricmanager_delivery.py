"""`installer run` on an HGX host root (H100 GPUs, NVSwitch functions): Fabric Manager of the
driver's exact version from NVIDIA's redist layout served on 127.0.0.1 (a mirror first),
verified against the operator's digests file (a mirror's redistrib JSON only says where the
archive lies), installed into versions/<ver>/, cached, and pruned with its version; an archive
of another version or with other bytes is refused, and one only a mirror vouches for is never
run."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import kit
import pytest
from kit.fabricmanager import archive_name, build_fabricmanager, relative_path
from lib.hostkit import INSTALL_DIR_HOST, installer_env, make_debian_host, ok, run_installer
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
    good = tampered.read_bytes()  # one bit flipped: the listed size, other bytes
    tampered.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with serve_directory(www) as (base, requests):
        yield base, www, requests


def env_for(root: Path, kernel: str, served: tuple[str, Path, list[str]], version: str,
            redist: str, vouched: str = "redist") -> dict[str, str]:
    """The operator's digests file lists the runfiles and the archives of `vouched`."""
    base, www, _ = served
    digests = kit.write_digests(root.parent / f"digests-{vouched}", www / A, www / B,
                                www / vouched)
    return installer_env(root, kernel, NVIDIA_DRIVER_VERSION=version,
                         NVIDIA_DRIVER_MIRRORS=base, NVIDIA_DRIVER_DIGESTS_FILE=str(digests),
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



def test_fabric_manager_comes_from_the_redist_tree_into_the_version_dir(
        hgx: tuple[Path, str], served: tuple[str, Path, list[str]]) -> None:
    root, kernel = hgx
    _, www, requests = served
    env = env_for(root, kernel, served, A, "mirror,redist")
    plan = ok(run_installer(env, "plan")).stdout
    assert f"fabric-manager: {archive_name(A)}" in plan
    assert f"its SHA-256 from digests file {env['NVIDIA_DRIVER_DIGESTS_FILE']}" in plan
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
    assert (install / "bin" / "nv-fabricmanager").is_file()  # bin -> current/bin
    cached = install / "cache/downloads" / archive_name(A)
    record = json.loads(Path(f"{cached}.download.json").read_text())
    # the marker names the archive the files came from, by the digest that vouched for it
    assert (shared / ".fabricmanager-version").read_text() == f"{A}\n{record['sha256']}\n"
    listed = json.loads((www / "redist" / f"redistrib_{A}.json").read_text())
    assert record["sha256"] == listed["fabricmanager"]["linux-x86_64"]["sha256"]
    assert record["verified_by"] == "digests-file" and cached.stat().st_mode & 0o777 == 0o600

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
    # The operator vouched for these bytes, which hold another version: its --version says so.
    result = run_installer(env_for(root, kernel, served, A, "wrong", vouched="wrong"), "run")
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


def hostile_archive(directory: Path, marker: Path) -> Path:
    """A mirror's own archive for A, listed with its true SHA-256 in the mirror's own
    redistrib JSON: its nv-fabricmanager, run with any argument, leaves `marker`."""
    import hashlib
    import io
    import tarfile

    top = archive_name(A)[: -len(".tar.xz")]
    archive = directory / relative_path(A)
    archive.parent.mkdir(parents=True, exist_ok=True)
    script = f'#!/bin/sh\ntouch "{marker}"\necho "Fabric Manager version is : {A}"\n'.encode()
    with tarfile.open(archive, "w:xz") as tar:
        for name, data, mode in ((f"{top}/bin/nv-fabricmanager", script, 0o755),
                                 (f"{top}/etc/fabricmanager.cfg", b"DAEMONIZE=1\n", 0o644)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    data = archive.read_bytes()
    (directory / f"redistrib_{A}.json").write_text(json.dumps({"fabricmanager": {
        "version": A, "linux-x86_64": {"relative_path": relative_path(A),
                                       "sha256": hashlib.sha256(data).hexdigest(),
                                       "size": str(len(data))}}}))
    return archive


def test_a_mirrors_own_redistrib_json_and_archive_are_refused_and_never_run(
        hgx: tuple[Path, str], served: tuple[str, Path, list[str]], tmp_path: Path) -> None:
    root, kernel = hgx
    _, www, requests = served
    marker = tmp_path / "ran-as-root"
    hostile_archive(www / "hostile", marker)
    requests.clear()
    # The .run is the operator's (its digests file lists it); the redist tree is a mirror's.
    result = run_installer(env_for(root, kernel, served, A, "hostile", vouched=A), "run")
    assert result.returncode == 26, result.stderr[-3000:]
    assert f"error[download-unverified]: {archive_name(A)}: nothing vouches" in result.stderr
    assert not marker.exists()
    assert f"/hostile/{relative_path(A)}" not in requests  # refused before a byte of it
    install = root / INSTALL_DIR_HOST.lstrip("/")
    assert not list((install / "cache/downloads").glob("fabricmanager-*"))
    assert not (install / "versions" / A / "bin" / "nv-fabricmanager").exists()
