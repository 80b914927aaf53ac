"""NVLSM on an NVLink5 host root with real processes and a real HTTP server on 127.0.0.1: the
archive from the driver's redistrib JSON (a mirror's JSON vouches for nothing; the digests file
does) or a pinned version, installed beside Fabric Manager; then `installer fabricmanager`'s
pair: the kit's stand-in nvlsm on the Limited PF's port GUID, its socket, then the stand-in
nv-fabricmanager on the same GUID, both stopped when one gives up."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import kit
import pytest
from kit.fabricmanager import build_fabricmanager
from kit.nvlink5 import hgx_b200_ports, write_cx7_port
from kit.nvlsm import archive_name, build_nvlsm, relative_path
from lib.hosttrees import B200, make_host, write_driver_version
from lib.httpfaults import serve_directory

from installer import runner
from installer.components import fm_archive, nvlsm, nvlsm_archive, processes, registry
from installer.components.fabricmanager_daemon import FabricManagerDaemon
from installer.components.supervisor import Supervisor
from installer.config import from_env
from installer.errors import (
    ChecksumMismatch,
    FabricManagerFailed,
    NvlsmUnavailable,
    UnverifiedDownload,
)
from installer.hostroot import HostRoot
from installer.layout import READY_FILE, Layout

V = "580.105.08"
SM = "2025.10.12"
GUID = "0xb8cef60300e61201"  # the first Limited PF of kit.nvlink5.hgx_b200_ports


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, list[str]]]:
    """NVIDIA's driver redist tree (Fabric Manager and NVLSM of V), one whose JSON lists no
    nvlsm, and CUDA's redist tree with NVLSM alone."""
    www = tmp_path_factory.mktemp("www")
    build_fabricmanager(V, www / "redist")
    build_nvlsm(SM, www / "redist", driver=V)
    build_fabricmanager(V, www / "bare")
    build_nvlsm(SM, www / "cuda")
    with serve_directory(www) as (base, requests):
        yield base, www, requests


def settings(root: Path, **env: str) -> dict[str, str]:
    return {"ROOT_MOUNT_DIR": str(root), "NVIDIA_INSTALL_DIR_CONTAINER": str(root) + "-none",
            **env}


def test_nvlsm_comes_from_the_drivers_redistrib_json_vouched_by_the_digests_file(
        tmp_path: Path, served: tuple[str, Path, list[str]]) -> None:
    base, www, requests = served
    root = make_host(tmp_path / "host", gpus=[B200])
    mirror = settings(tmp_path / "host", NVIDIA_FABRICMANAGER_REDIST=f"{base}/redist")
    layout = Layout.from_config(from_env(mirror), root)
    # The mirror's JSON only says where the archive lies: refused before any archive byte.
    with pytest.raises(UnverifiedDownload, match=archive_name(SM)):
        nvlsm_archive.fetch(from_env(mirror), layout, V, "x86_64")
    assert f"/redist/{relative_path(SM)}" not in requests
    digests = kit.write_digests(tmp_path / "digests", www / "redist")
    config = from_env({**mirror, "NVIDIA_DRIVER_DIGESTS_FILE": str(digests)})
    listed, archive = nvlsm_archive.fetch(config, layout, V, "x86_64")
    assert (listed.version, archive.name) == (SM, archive_name(SM))
    placed = nvlsm_archive.unpack_and_install(archive, tmp_path / "work", layout, V, SM)
    assert placed == ["bin/nvlsm", "share/nvidia/nvlsm/nvlsm.conf",
                      "share/nvidia/nvlsm/grpc_mgr.conf"]
    assert nvlsm_archive.installed(layout, V) == SM
    # nvlsm.conf names its plugin's config by the package's path, which a container lacks:
    # pointed at this install's copy.
    share = nvlsm_archive.share_dir(layout, V)
    conf = (share / "nvlsm.conf").read_text()
    assert f"plugin_options -grpc_mgr --config_file {share}/grpc_mgr.conf\n" in conf
    assert "/usr/share/nvidia/nvlsm/" not in conf
    assert os.access(nvlsm_archive.binary(layout, V), os.X_OK)
    marker = (nvlsm_archive.share_dir(layout, V) / ".nvlsm-version").read_text()
    assert marker.startswith(f"{SM}\n") and len(marker.split("\n")[1]) == 64


def test_a_pinned_version_comes_from_cudas_tree_and_its_pin_is_checked(
        tmp_path: Path, served: tuple[str, Path, list[str]]) -> None:
    base, www, _ = served
    root = make_host(tmp_path / "host", gpus=[B200])
    good = kit.write_digests(tmp_path / "d", www / "cuda").read_text().split()[0]
    pinned = settings(tmp_path / "host", NVIDIA_FABRICMANAGER_REDIST=f"{base}/bare",
                      NVIDIA_NVLSM_VERSION=SM, NVIDIA_NVLSM_REDIST=f"{base}/cuda")
    layout = Layout.from_config(from_env(pinned), root)
    with pytest.raises(ChecksumMismatch):
        nvlsm_archive.fetch(from_env({**pinned, "NVIDIA_NVLSM_SHA256": "0" * 64}), layout, V,
                            "x86_64")
    listed, archive = nvlsm_archive.fetch(from_env({**pinned, "NVIDIA_NVLSM_SHA256": good}),
                                          layout, V, "x86_64")
    assert listed.where == "NVIDIA_NVLSM_VERSION" and archive.name == archive_name(SM)
    # Without a pin, a driver JSON that lists no nvlsm names none.
    unpinned = settings(tmp_path / "host", NVIDIA_FABRICMANAGER_REDIST=f"{base}/bare")
    with pytest.raises(NvlsmUnavailable, match=f"no redistrib_{V}.json lists nvlsm") as caught:
        nvlsm_archive.locate(from_env(unpinned), V, "x86_64")
    assert caught.value.exit_code == 56
    assert json.loads((www / "bare" / f"redistrib_{V}.json").read_text()).get("nvlsm") is None


@pytest.fixture
def short(tmp_path: Path) -> Iterator[Path]:
    """A host root with a short path: a unix socket's path is at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="sm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def b200_host(tmp_path: Path, top: Path, *, umad: bool = True
              ) -> tuple[HostRoot, Path, Layout, dict]:
    """A B200 host with the IB modules' sysfs, a verified driver (not loaded on this machine:
    the stand-in Fabric Manager exits once it asks the driver), Fabric Manager and NVLSM of V
    installed."""
    root = make_host(top, gpus=[B200] * 2)
    for port in hgx_b200_ports():
        write_cx7_port(top, port)
    if not umad:
        (top / "sys/class/infiniband_mad/abi_version").unlink()
    write_driver_version(top, V)
    root.write_atomic(READY_FILE, f"DRIVER_VERSION={V}\nINSTALL_DIR=/var/lib/nvidia\n")
    env = settings(top)
    layout = Layout.from_config(from_env(env), root)
    tree = fm_archive.unpack(build_fabricmanager(V, tmp_path / "redist"), tmp_path / "fm")
    fm_archive.install(tree, layout.version_dir(V), fm_archive.config_dir(layout, V), V)
    archive = build_nvlsm(SM, tmp_path / "cuda")
    nvlsm_archive.unpack_and_install(archive, tmp_path / "sm", layout, V, SM)
    return root, top, layout, env


def run_pair(root: HostRoot, top: Path, env: dict, monkeypatch: pytest.MonkeyPatch
             ) -> tuple[FabricManagerFailed, list[str]]:
    monkeypatch.setenv("NVFAKE_TEST_ROOT", str(top))  # the stand-ins' host paths
    daemon = FabricManagerDaemon(from_env(env), root, env={},
                                 run_dir=top / "var/run/nvidia-fabricmanager")
    try:
        with pytest.raises(FabricManagerFailed) as caught:
            Supervisor(daemon, root, restarts=0, poll=0.02).run()
    finally:
        daemon.close()
    return caught.value, list(daemon.tail)


def test_nvlsm_runs_on_the_limited_pfs_guid_before_fabric_manager(
        tmp_path: Path, short: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, top, _, env = b200_host(tmp_path, short)
    error, said = run_pair(root, top, env, monkeypatch)
    assert error.message.startswith("fabricmanager exited 1 times within 10 minutes")
    sm = [line for line in said if line.startswith("nvlsm: ")]
    assert sm[0].endswith(f"binding to port GUID {GUID} (mlx5_1 port 1)")
    assert any(line.endswith("SUBNET UP") for line in sm)
    connected = [i for i, line in enumerate(said)
                 if line.endswith(f"Connected to NVLink Subnet Manager on port GUID {GUID}")]
    assert connected and connected[0] > said.index(next(line for line in sm if "SUBNET UP" in
                                                        line))
    # Fabric Manager gave up (no driver is loaded here), then NVLSM was stopped with SIGTERM:
    # it said so last, and removed its socket and pid file.
    fm = [line for line in said if not line.startswith("nvlsm: ")]
    assert fm[-1].endswith("the NVIDIA driver is not loaded")
    assert said[-1].endswith("[nvlsm] received a termination signal, exiting")
    run = top / "var/run/nvidia-fabricmanager"
    assert not (run / nvlsm.SOCKET_NAME).exists() and not (run / nvlsm.PID_NAME).exists()


def test_an_nvlsm_that_cannot_bind_the_port_never_gets_a_fabric_manager(
        tmp_path: Path, short: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, top, _, env = b200_host(tmp_path, short, umad=False)
    error, said = run_pair(root, top, env, monkeypatch)
    assert error.message.startswith("fabricmanager exited 1 times within 10 minutes (last "
                                    "exit status 1)")
    assert said[-1].endswith("ERR: umad_init: cannot open the user MAD interface (is ib_umad "
                             "loaded?)")
    assert not [line for line in said if not line.startswith("nvlsm: ")]  # no FM line at all


def test_the_pairs_argv() -> None:
    assert nvlsm.nvlsm_argv(Path("/i/bin/nvlsm"), Path("/i/nvlsm.conf"), GUID,
                            Path("/var/run/nvidia-fabricmanager/nvlsm.pid")) == [
        "/i/bin/nvlsm", "--config", "/i/nvlsm.conf", "--guid", GUID, "--pid_file",
        "/var/run/nvidia-fabricmanager/nvlsm.pid"]
    assert nvlsm.fabricmanager_argv(Path("/i/bin/nv-fabricmanager"), Path("/w/fm.cfg"),
                                    GUID) == [
        "/i/bin/nv-fabricmanager", "--config", "/w/fm.cfg", "--fm-sm-mgmt-port-guid", GUID]


STOPPING = """import signal, sys, time
def bye(*a):
    time.sleep({linger})
    open({log!r}, "a").write({name!r} + "\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("up", flush=True)
while True:
    time.sleep(0.1)
"""


def test_before_an_unload_fabric_manager_stops_before_nvlsm(tmp_path: Path) -> None:
    install = tmp_path / "install"
    stopped = tmp_path / "stopped"
    children = []
    said: list[str] = []
    # NVLSM stops at once, Fabric Manager takes a while: signalled together, NVLSM would be
    # gone first.
    for name, linger in (("nvlsm", 0.0), ("nv-fabricmanager", 0.5)):
        path = install / "versions" / V / "bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!{sys.executable}\n"
                        + STOPPING.format(linger=linger, log=str(stopped), name=name))
        path.chmod(0o755)
        children.append(runner.spawn([str(path)], on_line=said.append))
    try:
        deadline = time.monotonic() + 15
        while said.count("up") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        root = HostRoot(Path("/"))
        found = processes.find(root, registry.daemons(), (PurePosixPath(str(install)),))
        assert sorted(d.name for d in found) == ["nv-fabricmanager", "nvlsm"]
        assert processes.terminate_in_order(root, found, registry.daemons()) == []
        assert stopped.read_text() == "nv-fabricmanager\nnvlsm\n"
    finally:
        for child in children:
            child.send_signal(9)
            child.wait(5)
