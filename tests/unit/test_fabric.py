"""The fabric readiness rules on NVML's answers: which GPU states keep a node from ready on any
board, GFD's clique, the partition diagnosis, which GPUs make the fabricmanager container
wait, and its bounded wait (raised where nothing of ours runs, logged beside Fabric Manager)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from lib.hosttrees import B200, GB200, H100, L4, T4, make_host

from installer import verify
from installer.components import fabric
from installer.errors import FabricNotReady
from installer.hostroot import HostRoot
from installer.verify import GpuInfo, VerifyReport, fabric_problems

CLUSTER = "3f1c9a52-7be4-4d6e-8a10-2c5f9e7b6d41"


def gpu(index: int = 0, state: str | None = "completed", status: str | None = "success",
        cluster: str | None = CLUSTER, clique: int | None = 7, mask: int | None = 0,
        health: str | None = "healthy") -> GpuInfo:
    return GpuInfo(index, "NVIDIA B200", f"GPU-{index}", f"0000:{0x18 + index:02x}:00.0",
                   183359, fabric_state=state, fabric_status=status,
                   fabric_cluster_uuid=cluster, fabric_clique_id=clique,
                   fabric_health_mask=mask, fabric_health_summary=health)


def report(*gpus: GpuInfo) -> VerifyReport:
    return VerifyReport("580.105.08", (), "580.105.08", "580.105.08", tuple(gpus), ())


@pytest.mark.parametrize("info, ready", [
    (gpu(), True),
    (gpu(health="limited-capacity"), True),  # degraded, not unhealthy: CUDA runs
    (gpu(health=None, mask=None), True),  # a v2 or v1 answer: no summary to judge
    (gpu(state="not-supported"), True),
    (gpu(state="unavailable"), True),  # NOT_SUPPORTED: NVML keeps no fabric for it
    (gpu(state="error", status="Unknown Error"), False),  # any other error: not known up
    (gpu(state=None), True),  # nvidia-smi's answer: no fabric asked
    (gpu(state="not-started"), False),
    (gpu(state="in-progress"), False),
    (gpu(status="Insufficient Resources (23)"), False),
    (gpu(health="unhealthy"), False),
])
def test_any_gpu_that_reports_a_fabric_must_complete_it(info: GpuInfo, ready: bool) -> None:
    assert (fabric_problems([info]) == []) is ready


def test_the_clique_is_gfds() -> None:
    assert report(gpu(0), gpu(1)).clique == f"{CLUSTER}.7"
    assert report(gpu(0), gpu(1, clique=8)).clique is None  # they disagree
    assert report(gpu(0), gpu(1, cluster="0a9b8c7d-6e5f-4a3b-9c2d-1e0f2a3b4c5d")).clique is None
    assert report(gpu(0, cluster=None), gpu(1, cluster=None)).clique is None  # zero UUIDs
    # Only attached GPUs count: one still in progress does not hide the others' clique.
    assert report(gpu(0), gpu(1, state="in-progress", cluster=None)).clique == f"{CLUSTER}.7"
    assert report(gpu(0, state="not-supported", cluster=None)).clique is None
    assert report(gpu(0, state="not-supported")).fabric == "not-applicable"
    assert report(gpu(0), gpu(1, state="in-progress")).fabric == "pending"


def test_the_partition_diagnosis_reads_the_health_mask() -> None:
    assigned, unassigned, unknown = 1 << 12, 2 << 12, 0
    gpus = [gpu(0, mask=assigned), gpu(1, mask=unassigned | 2), gpu(2, mask=unknown)]
    assert fabric.partition_reasons(HostRoot(Path("/nonexistent")), gpus) == [
        "no fabric partition is activated for GPU 1 (0000:19:00.0) (shared NVSwitch mode, "
        "FABRIC_MODE=1: activate a partition through Fabric Manager's API)"]


@pytest.mark.parametrize("device_ids, waits", [
    ((B200,), True), ((GB200,), True), ((H100,), True), ((0x3F10,), True),
    ((L4,), False), ((T4,), False), ((), False)])
def test_which_gpus_make_the_container_wait(tmp_path: Path, device_ids: tuple[int, ...],
                                            waits: bool) -> None:
    root = make_host(tmp_path, gpus=device_ids)
    assert fabric.may_report_fabric(root) is waits


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def waiting(monkeypatch: pytest.MonkeyPatch, answer: Any) -> tuple[fabric.FabricWait, Clock]:
    monkeypatch.setattr(verify, "nvml_gpus", lambda install_dir, runner: answer)
    clock = Clock()
    wait = fabric.FabricWait(Path("/install"), HostRoot(Path("/nonexistent")),
                             lambda gpus: ["NVLSM is not running"], timeout=60, every=3,
                             clock=clock)
    return wait, clock


def test_where_nothing_of_ours_runs_the_wait_ends_in_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    wait, clock = waiting(monkeypatch, ((gpu(state="in-progress"),), []))
    assert wait.check(None, ours_running=False) is None
    clock.now = 57.0
    assert wait.check(None, ours_running=False) is None
    clock.now = 60.0
    with pytest.raises(FabricNotReady) as raised:
        wait.check(None, ours_running=False)
    assert raised.value.message == (
        "the NVLink fabric is not complete after 60 s: GPU 0 (0000:18:00.0): NVLink fabric "
        "in-progress, not completed (CUDA fails with error 802, system not yet initialized); "
        "because NVLSM is not running")
    assert raised.value.exit_code == 46


def test_beside_our_fabric_manager_it_says_so_once_and_waits_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    wait, clock = waiting(monkeypatch, ((gpu(state="in-progress"),), []))
    caplog.set_level(logging.ERROR)
    for now in (0.0, 61.0, 64.0, 67.0):
        clock.now = now
        assert wait.check(None, ours_running=True) is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("error[fabric-not-ready]: the NVLink fabric")


def test_an_nvml_that_does_not_answer_vouches_for_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    wait, clock = waiting(monkeypatch, ((), ["NVML nvmlInit failed: Driver Not Loaded"]))
    assert wait.check(None, ours_running=False) is None
    clock.now = 61.0
    with pytest.raises(FabricNotReady) as raised:
        wait.check(None, ours_running=False)
    assert "NVML nvmlInit failed" in raised.value.message


def test_a_completed_fabric_and_a_board_without_one_are_ready(
        monkeypatch: pytest.MonkeyPatch) -> None:
    wait, _ = waiting(monkeypatch, ((gpu(0), gpu(1)), []))
    assert wait.check(None, ours_running=False) == "completed"
    wait, _ = waiting(monkeypatch, ((gpu(0, state="not-supported"),), []))
    assert wait.check(None, ours_running=False) == "not-supported"
