"""Fabric state and persistence mode through real pynvml and the kit's libnvidia-ml (which
answers nvmlDeviceGetGpuFabricInfo[V] and nvmlDeviceGet/SetPersistenceMode from the state the
kit's module exposes), under the kit's test-only root: what `installer verify` makes of an
NVSwitch node before and after Fabric Manager, of a node without switches, and of GPUs NVML
keeps no fabric state for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kit import fabric
from kit.fake_host import TEST_ROOT_ENV, FakeGpu, write_loaded_driver
from lib import kituserspace

from installer.runner import SubprocessRunner
from installer.verify import verify

VERSION = "580.105.08"
H100 = [FakeGpu("0000:18:00.0", 0x2330, "NVIDIA H100 80GB HBM3", 0),
        FakeGpu("0000:2a:00.0", 0x2330, "NVIDIA H100 80GB HBM3", 1)]
A100 = [FakeGpu("0000:18:00.0", 0x20B2, "NVIDIA A100-SXM4-80GB", 0)]
# What the kit's libcuda answers while a GPU's fabric registration is not complete.
CUDA_802 = "CUDA cuInit failed: CUDA_ERROR_SYSTEM_NOT_READY (802): system not yet initialized"
SWITCHES = [fabric.FakeSwitch("0000:05:00.0"), fabric.FakeSwitch("0000:06:00.0")]


pytestmark = kituserspace.skip_without_tools()


@pytest.fixture(scope="module")
def install_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nvidia-smi and the kit's NVML of VERSION in <install>/bin and lib64 (soname linked)."""
    return kituserspace.installed(tmp_path_factory, VERSION)


def node(root: Path, gpus: list[FakeGpu], *, state: int | None, persistence: bool = False,
         switches: list[fabric.FakeSwitch] = SWITCHES, status: int = 0) -> Path:
    write_loaded_driver(root, VERSION, gpus)
    fabric.write_driver_switches(root, switches)
    for gpu in gpus:
        fabric.write_gpu_state(root, gpu.address, persistence=persistence,
                               fabric_supported=state is not None,
                               fabric_state=state or 0, fabric_status=status)
    return root


def runner(root: Path) -> SubprocessRunner:
    return SubprocessRunner(base_env={**os.environ, TEST_ROOT_ENV: str(root)})


def check(install_dir: Path, root: Path, gpus: list[FakeGpu], required: bool = True):  # type: ignore[no-untyped-def]
    return verify(install_dir=install_dir, expected_version=VERSION,
                  expected_gpus=[g.address for g in gpus], runner=runner(root),
                  fabric_required=required, switches=[s.address for s in SWITCHES],
                  require_fabric=True)


def test_nvswitch_node_fails_until_the_fabric_completes(install_dir: Path,
                                                        tmp_path: Path) -> None:
    before = check(install_dir, node(tmp_path / "before", H100, state=fabric.NOT_STARTED), H100)
    assert [g.fabric_state for g in before.gpus] == ["not-started", "not-started"]
    assert before.fabric == "pending" and not before.ok
    assert before.problems[:len(H100)] == tuple(
        f"GPU {i} ({g.address}): NVLink fabric not-started, not completed (CUDA fails with "
        "error 802, system not yet initialized)" for i, g in enumerate(H100))
    assert before.problems[-1].startswith(CUDA_802)

    during = check(install_dir, node(tmp_path / "during", H100, state=fabric.IN_PROGRESS), H100)
    assert during.fabric == "pending" and "NVLink fabric in-progress" in during.problems[0]

    after = check(install_dir, node(tmp_path / "after", H100, state=fabric.COMPLETED,
                                    persistence=True), H100)
    assert after.ok, after.problems
    assert after.fabric == "completed"
    document = after.to_json()
    # HGX H100 reports no cluster UUID (all zero): no clique.
    assert document["fabric"] == {"required": True, "state": "completed",
                                  "nvswitches": [s.address for s in SWITCHES],
                                  "clique": None, "reasons": []}
    assert [g["fabric"] for g in document["gpus"]] == [
        {"state": "completed", "status": "success", "cluster_uuid": None, "clique_id": 0,
         "health_mask": 0, "health_summary": "not-supported"}] * 2
    assert [g["persistence_mode"] for g in document["gpus"]] == ["enabled"] * 2


def test_a_failed_registration_is_a_problem(install_dir: Path, tmp_path: Path) -> None:
    # NVML_ERROR_NOT_READY (10) in the status of a "completed" registration.
    report = check(install_dir, node(tmp_path, H100[:1], state=fabric.COMPLETED, status=10),
                   H100[:1])
    assert report.gpus[0].fabric_status is not None
    assert report.gpus[0].fabric_status.endswith("(10)")
    assert report.problems[:-1] == (
        f"GPU 0 ({H100[0].address}): its NVLink fabric registration failed "
        f"({report.gpus[0].fabric_status}); CUDA fails on it",)
    assert report.problems[-1].startswith(CUDA_802)


def test_without_switches_fabric_is_not_applicable(install_dir: Path, tmp_path: Path) -> None:
    root = node(tmp_path, H100, state=fabric.NOT_SUPPORTED, switches=[])
    report = check(install_dir, root, H100, required=False)
    assert report.ok, report.problems
    assert report.fabric == "not-applicable"
    assert [g.fabric_state for g in report.gpus] == ["not-supported", "not-supported"]
    assert [g.persistence_mode for g in report.gpus] == ["disabled", "disabled"]


def test_gpus_without_fabric_state_are_unavailable_not_failing(install_dir: Path,
                                                                tmp_path: Path) -> None:
    # An A100 board: NVML answers NOT_SUPPORTED (fabric state is Hopper and newer).
    report = check(install_dir, node(tmp_path, A100, state=None), A100)
    assert report.ok, report.problems
    assert report.gpus[0].fabric_state == "unavailable"
    assert report.fabric == "unknown"


def test_the_library_checks_the_struct_version_and_persistence_needs_root(
        install_dir: Path, tmp_path: Path) -> None:
    """nvml.h's layouts through pynvml: v1 and the versioned v2/v3 calls; a wrong version is
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH; SetPersistenceMode reaches the (absent) module."""
    root = node(tmp_path, H100[:1], state=fabric.COMPLETED)
    fabric.write_gpu_state(root, H100[0].address, fabric_state=fabric.COMPLETED,
                           cluster_uuid="6e766661-6b65-2d66-6162-7269632d3031", clique_id=4,
                           health_mask=0x1000, health_summary=fabric.HEALTHY)
    script = r"""
import ctypes, json, pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
answers = {}
v1 = pynvml.c_nvmlGpuFabricInfo_t()
pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(v1))
answers["v1"] = [v1.state, v1.status, bytes(v1.clusterUuid).decode(), v1.cliqueId]
for name in ("c_nvmlGpuFabricInfo_v2_t", "c_nvmlGpuFabricInfo_v3_t"):
    info = getattr(pynvml, name)()
    pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    answers[name] = [info.state, info.status, info.healthMask,
                     getattr(info, "healthSummary", None)]
bad = pynvml.c_nvmlGpuFabricInfo_v2_t()
bad.version = 0x01000024
try:
    pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(bad))
except pynvml.NVMLError as exc:
    answers["bad"] = exc.value
try:
    pynvml.nvmlDeviceSetPersistenceMode(handle, 1)
except pynvml.NVMLError as exc:
    answers["set"] = exc.value
print(json.dumps(answers))
"""
    env = {**os.environ, TEST_ROOT_ENV: str(root),
           "LD_LIBRARY_PATH": str(install_dir / "lib64")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True).stdout
    answers = json.loads(out)
    assert answers["v1"] == [3, 0, "nvfake-fabric-01", 4]
    assert answers["c_nvmlGpuFabricInfo_v2_t"] == [3, 0, 0x1000, None]
    assert answers["c_nvmlGpuFabricInfo_v3_t"] == [3, 0, 0x1000, fabric.HEALTHY]
    assert answers["bad"] == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    # /dev/nvidiactl under the test root is a plain file: its ioctl fails (ENOTTY), an error
    # NVML has no name for.
    assert answers["set"] == 999  # NVML_ERROR_UNKNOWN
