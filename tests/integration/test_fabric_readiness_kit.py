"""Readiness on any NVLink fabric, through `installer verify`'s code (app.verify_installed),
real pynvml and the kit's libnvidia-ml answering the v3 fabric struct: an HGX B200 (no
NVSwitch PCI function on the host) and an NVL72 GB200 compute tray are ready only once every
GPU's fabric completed with success and is not unhealthy; the clique is GFD's; each diagnosis
names why a fabric is not complete. And the fabricmanager container: its readiness file stays
absent until the fabric completes, and its bounded wait ends in fabric-not-ready."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from kit import fabric
from kit.fake_host import TEST_ROOT_ENV, FakeGpu, write_loaded_driver
from lib import kituserspace

from installer import app
from installer.components.fabricmanager_daemon import FabricManagerDaemon
from installer.components.registry import fabric_diagnosis
from installer.components.supervisor import Supervisor, ready_file
from installer.config import from_env
from installer.errors import FabricNotReady
from installer.hostroot import HostRoot
from installer.layout import READY_FILE
from installer.runner import SubprocessRunner

VERSION = "580.105.08"
B200 = list(fabric.HGX_B200.gpus)
GB200 = list(fabric.NVL72_GB200_TRAY.gpus)
H100_PCIE = [FakeGpu("0000:18:00.0", 0x2331, "NVIDIA H100 PCIe", 0)]
CLUSTER = "3f1c9a52-7be4-4d6e-8a10-2c5f9e7b6d41"
OTHER_CLUSTER = "0a9b8c7d-6e5f-4a3b-9c2d-1e0f2a3b4c5d"


pytestmark = kituserspace.skip_without_tools()


@pytest.fixture(scope="module")
def install_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nvidia-smi and the kit's NVML of VERSION in <install>/bin and lib64 (soname linked)."""
    return kituserspace.installed(tmp_path_factory, VERSION)


def board(root: Path, gpus: list[FakeGpu], state: int, *, status: int = 0,
          cluster: str | None = CLUSTER, cliques: tuple[int, ...] = (), health_mask: int = 0,
          health: int = fabric.HEALTHY) -> Path:
    """A node whose GPUs report `state` (no NVSwitch PCI function: B200 and GB200 alike)."""
    write_loaded_driver(root, VERSION, gpus)
    board = fabric.Board("test", tuple(gpus))
    fabric.write_board_fabric(root, board, state, status=status, cluster_uuid=cluster,
                              clique_id=7, health_mask=health_mask, health_summary=health)
    for gpu, clique in zip(gpus, cliques):  # GPUs that disagree
        fabric.write_gpu_state(root, gpu.address, fabric_state=state, fabric_status=status,
                               cluster_uuid=cluster, clique_id=clique,
                               health_mask=health_mask, health_summary=health)
    return root


def verify_node(install_dir: Path, root: Path):  # type: ignore[no-untyped-def]
    config = from_env({"ROOT_MOUNT_DIR": str(root), "NVIDIA_INSTALL_DIR_CONTAINER":
                       str(install_dir), "NVIDIA_DRIVER_VERSION": VERSION})
    runner = SubprocessRunner(base_env={**os.environ, TEST_ROOT_ENV: str(root)})
    return app.verify_installed(config, runner)


@pytest.mark.parametrize("state, status, health, words", [
    (fabric.NOT_STARTED, 0, fabric.HEALTHY, "NVLink fabric not-started, not completed"),
    (fabric.IN_PROGRESS, 0, fabric.HEALTHY, "NVLink fabric in-progress, not completed"),
    (fabric.COMPLETED, fabric.NVML_ERROR_INSUFFICIENT_RESOURCES, fabric.HEALTHY,
     "its NVLink fabric registration failed (Insufficient Resources (23))"),
    (fabric.COMPLETED, 0, fabric.UNHEALTHY, "its NVLink fabric completed but its health "
     "summary is unhealthy"),
], ids=["not-started", "in-progress", "completed-failed", "unhealthy"])
def test_a_b200_whose_fabric_is_not_complete_is_never_ready(
        install_dir: Path, tmp_path: Path, state: int, status: int, health: int,
        words: str) -> None:
    report = verify_node(install_dir, board(tmp_path, B200, state, status=status,
                                            health=health))
    assert not report.ok and report.fabric == "pending"
    assert not report.fabric_required  # no NVSwitch PCI function: the old rule let it pass
    for i, gpu in enumerate(B200):
        assert any(p.startswith(f"GPU {i} ({gpu.address}): {words}") for p in report.problems), \
            report.problems
    # GFD counts a GPU as attached by state, status and UUID, not by health.
    assert report.clique == (f"{CLUSTER}.7" if words.endswith("unhealthy") else None)


def test_a_b200_whose_fabric_nvml_cannot_read_is_never_ready(install_dir: Path,
                                                             tmp_path: Path) -> None:
    # NVML_ERROR_UNKNOWN (999) from the fabric query: not "no fabric", which only
    # NOT_SUPPORTED means; the node stays not ready.
    root = board(tmp_path, B200, fabric.COMPLETED)
    fabric.write_gpu_state(root, B200[0].address, fabric_state=fabric.COMPLETED,
                           cluster_uuid=CLUSTER, clique_id=7, health_summary=fabric.HEALTHY,
                           query_error=999)
    report = verify_node(install_dir, root)
    assert not report.ok and report.fabric == "pending"
    assert report.gpus[0].fabric_state == "error"
    assert any(p.startswith(f"GPU 0 ({B200[0].address}): NVML could not read its NVLink fabric")
               for p in report.problems), report.problems


def test_a_completed_b200_is_ready_with_its_clique(install_dir: Path, tmp_path: Path) -> None:
    report = verify_node(install_dir, board(tmp_path, B200, fabric.COMPLETED))
    assert report.ok, report.problems
    document = report.to_json()
    assert document["fabric"]["state"] == "completed"
    assert document["fabric"]["clique"] == f"{CLUSTER}.7"
    assert [g["fabric"] for g in document["gpus"]] == [
        {"state": "completed", "status": "success", "cluster_uuid": CLUSTER, "clique_id": 7,
         "health_mask": 0, "health_summary": "healthy"}] * len(B200)


def test_no_clique_when_the_gpus_disagree_or_name_no_cluster(install_dir: Path,
                                                             tmp_path: Path) -> None:
    split = verify_node(install_dir, board(tmp_path / "split", B200, fabric.COMPLETED,
                                           cliques=(7, 8)))
    assert split.ok and split.clique is None
    zero = verify_node(install_dir, board(tmp_path / "zero", B200, fabric.COMPLETED,
                                          cluster=None))
    assert zero.ok and zero.clique is None and zero.gpus[0].fabric_cluster_uuid is None


def test_a_pcie_board_without_a_fabric_is_ready(install_dir: Path, tmp_path: Path) -> None:
    report = verify_node(install_dir, board(tmp_path, H100_PCIE, fabric.NOT_SUPPORTED))
    assert report.ok, report.problems
    assert report.fabric == "not-applicable" and report.clique is None


def test_the_diagnoses_name_why(install_dir: Path, tmp_path: Path) -> None:
    # Shared NVSwitch mode: in progress until a partition holding the GPUs is activated.
    shared = verify_node(install_dir, board(tmp_path / "shared", B200, fabric.IN_PROGRESS,
                                            health_mask=fabric.PARTITION_NOT_ASSIGNED))
    listed = ", ".join(f"GPU {i} ({g.address})" for i, g in enumerate(B200))
    assert shared.fabric_reasons == (
        f"no fabric partition is activated for {listed} (shared NVSwitch mode, FABRIC_MODE=1: "
        "activate a partition through Fabric Manager's API)",)
    assert f"the fabric is not complete because {shared.fabric_reasons[0]}" in shared.problems
    # An NVL72 compute tray: the rack's switch trays bring the fabric up.
    tray = verify_node(install_dir, board(tmp_path / "tray", GB200, fabric.IN_PROGRESS))
    assert len(tray.fabric_reasons) == 1
    assert "10de:2941" in tray.fabric_reasons[0]
    assert "switch trays" in tray.fabric_reasons[0]
    assert tray.to_json()["fabric"]["reasons"] == list(tray.fabric_reasons)


def test_an_hgx_node_without_fabric_manager_says_so(install_dir: Path, tmp_path: Path) -> None:
    root = board(tmp_path, B200, fabric.NOT_STARTED)
    fabric.write_pci_switch(root / "sys/bus/pci/devices", fabric.FakeSwitch("0000:05:00.0"))
    reasons = fabric_diagnosis(HostRoot(root), ())
    assert reasons == ["Fabric Manager (nv-fabricmanager) is not running on this NVSwitch "
                       "node (1 NVSwitch function(s) (10de:22a3) at 0000:05:00.0)"]


# --- the fabricmanager container where nothing of ours runs (an NVL72 compute tray) -------


def tray_container(install_dir: Path, root: Path, timeout: str):  # type: ignore[no-untyped-def]
    write = HostRoot(root)
    write.write_atomic(READY_FILE, f"DRIVER_VERSION={VERSION}\nINSTALL_DIR=/\n")
    config = from_env({"ROOT_MOUNT_DIR": str(root), "NVIDIA_INSTALL_DIR_CONTAINER":
                       str(install_dir), "NVIDIA_INSTALLER_FABRIC_TIMEOUT": timeout})
    daemon = FabricManagerDaemon(config, write)
    daemon.wait.every = 0.05
    os.environ[TEST_ROOT_ENV] = str(root)  # the NVML child reads the kit's state under root
    return write, daemon


@pytest.fixture
def test_root_env() -> object:
    saved = os.environ.get(TEST_ROOT_ENV)
    yield
    if saved is None:
        os.environ.pop(TEST_ROOT_ENV, None)
    else:
        os.environ[TEST_ROOT_ENV] = saved


def test_the_tray_readiness_file_waits_for_the_fabric(install_dir: Path, tmp_path: Path,
                                                      test_root_env: object) -> None:
    root = board(tmp_path, GB200, fabric.IN_PROGRESS)
    host, daemon = tray_container(install_dir, root, "0")
    stop = threading.Event()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            Supervisor(daemon, host, restarts=0, stop=stop, poll=0.02).run()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    marker = host.local(ready_file("fabricmanager"))
    try:
        time.sleep(1.5)  # many NVML asks: still in progress
        assert not marker.exists() and not errors
        board(root, GB200, fabric.COMPLETED)
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text() == (
            f"DRIVER_VERSION={VERSION}\nSTATE=fabric-complete\nREASON=no NVSwitch PCI "
            "function (class 0x0680, vendor 10de) in /sys/bus/pci/devices\nFABRIC=completed\n")
    finally:
        stop.set()
        thread.join(10)
    assert not errors


def test_the_tray_wait_is_bounded(install_dir: Path, tmp_path: Path,
                                  test_root_env: object) -> None:
    root = board(tmp_path, GB200, fabric.NOT_STARTED)
    host, daemon = tray_container(install_dir, root, "0.5")
    daemon.diagnose = lambda gpus: fabric_diagnosis(host, gpus)
    with pytest.raises(FabricNotReady) as raised:
        Supervisor(daemon, host, restarts=0, poll=0.02).run()
    assert raised.value.exit_code == 46 and raised.value.reference == "fabric-not-ready"
    assert "NVLink fabric not-started, not completed" in raised.value.message
    assert "are NVL72 parts whose fabric the rack's switch trays bring up" in raised.value.message
    assert not host.local(ready_file("fabricmanager")).exists()


def test_a_gb200_tray_reports_its_coherent_memory_mode(install_dir: Path,
                                                       tmp_path: Path) -> None:
    """The installer loads R580 on a Grace-coupled GPU with NVreg_CoherentGPUMemoryMode=driver;
    verify reads it back from /proc/driver/nvidia/params (as the kit's 580 module prints it)."""
    root = board(tmp_path, GB200, fabric.COMPLETED)
    params = root / "proc/driver/nvidia/params"
    params.write_text('ExcludedGpus: ""\nCoherentGPUMemoryMode: ""\n')
    without = verify_node(install_dir, root)
    assert without.problems == (
        "the nvidia module reports CoherentGPUMemoryMode '' in /proc/driver/nvidia/params, "
        "expected 'driver' (a module loaded without the installer's "
        "NVreg_CoherentGPUMemoryMode)",)
    params.write_text('ExcludedGpus: ""\nCoherentGPUMemoryMode: "driver"\n')
    report = verify_node(install_dir, root)
    assert report.ok, report.problems
    document = report.to_json()
    assert document["coherent_memory"] == "driver"
    assert document["fabric"]["clique"] == f"{CLUSTER}.7"
