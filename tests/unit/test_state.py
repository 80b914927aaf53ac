from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from installer import state
from installer.errors import LockTimeout


def test_record_round_trip_and_broken_records_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    record = state.InstallRecord(
        version="580.105.08",
        flavour="open",
        kernel="6.1.0-56-amd64",
        source="runfile",
        install_dir="/var/lib/nvidia",
        gpus=("0000:00:04.0",),
        kernels=("6.1.0-56-amd64",),
    )
    state.write_record(path, record)
    assert state.read_record(path) == record
    path.write_text("{not json")
    assert state.read_record(path) is None
    path.write_text('{"format": 99}')
    assert state.read_record(path) is None


def test_gke_cache_file_format(tmp_path: Path) -> None:
    path = tmp_path / ".cache"
    path.write_text(state.gke_cache_text("6.1.0-56-amd64", "550.54.15"))
    assert state.read_gke_cache(path) == {
        "CACHE_KERNEL_VERSION": "6.1.0-56-amd64",
        "CACHE_NVIDIA_DRIVER_VERSION": "550.54.15",
    }


def test_second_holder_waits_then_gets_the_lock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lock_path = tmp_path / ".installer.lock"
    order: list[str] = []

    def second() -> None:
        with state.HostLock(lock_path, timeout=5, poll=0.02):
            order.append("second")

    with caplog.at_level(logging.INFO, logger="installer"):
        with state.HostLock(lock_path, timeout=5):
            thread = threading.Thread(target=second)
            thread.start()
            time.sleep(0.2)
            order.append("first")
        thread.join(5)
    assert order == ["first", "second"]
    assert any("waiting for another installer" in r.message for r in caplog.records)


def test_lock_times_out_with_its_own_error(tmp_path: Path) -> None:
    lock_path = tmp_path / ".installer.lock"
    holder = state.HostLock(lock_path, timeout=5)
    waiter = state.HostLock(lock_path, timeout=0.1, poll=0.02)
    with holder, pytest.raises(LockTimeout) as info, waiter:
        pass
    assert info.value.exit_code == 41
