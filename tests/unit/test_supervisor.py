"""gpus-ready: the one file a GPU consumer waits for. It appears when the driver is verified and
loaded and every component container is up for it (on a board with an NVLink fabric, the
fabricmanager container, which runs Fabric Manager and NVLSM, once the GPUs joined the fabric),
and goes when any of that stops being true, while driver-ready alone is already there during a
fabric bring-up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, Union

import pytest
from lib.hosttrees import B200, H100, make_host, write_driver_version

from installer.components import names
from installer.components.supervisor import (
    Driver,
    Idle,
    Running,
    Supervisor,
    ready_file,
    sync_gpus_ready,
)
from installer.errors import FabricManagerFailed, InstallerError
from installer.hostroot import HostRoot
from installer.layout import GPUS_READY_FILE, READY_FILE

V = "580.105.08"
COMPONENTS = ("fabricmanager", "persistenced")
READY_TEXT = (f"DRIVER_VERSION={V}\nKERNEL_MODULE_TYPE=open\nKERNEL_RELEASE=6.1.0\n"
              "INSTALL_DIR=/home/kubernetes/bin/nvidia\n")


def test_the_components_are_the_ones_the_gate_waits_for() -> None:
    assert names() == COMPONENTS


class StillUp:
    def poll(self) -> int | None:
        return None

    def stop(self, timeout: float) -> None:
        pass


class FabricDaemon:
    """The fabricmanager container's part as the supervisor sees it: idle on a board without a
    fabric; on one with a fabric, running and ready only once `joined` is set (Fabric Manager,
    and on NVLink5 boards NVLSM, registered every GPU)."""

    name = "fabricmanager"

    def __init__(self, fabric: bool) -> None:
        self.fabric = fabric
        self.joined = threading.Event()

    def plan(self, driver: Driver) -> Union[Idle, Callable[[], Running]]:
        return StillUp if self.fabric else Idle("no NVSwitch on this board")

    def ready(self, running: Running) -> str | None:
        return f"DRIVER_VERSION={V}\nSTATE=running\n" if self.joined.is_set() else None

    def failed(self, message: str) -> InstallerError:
        return FabricManagerFailed(message)


def host(tmp_path: Path, gpu: int) -> HostRoot:
    root = make_host(tmp_path / "host", gpus=[gpu])
    write_driver_version(tmp_path / "host", V)
    root.write_atomic(READY_FILE, READY_TEXT)
    return root


def persistenced_up(root: HostRoot) -> None:
    root.write_atomic(ready_file("persistenced"), f"DRIVER_VERSION={V}\nSTATE=running\n")


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def stays(check: Callable[[], bool], seconds: float = 0.3) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check()
        time.sleep(0.01)


class Container(NamedTuple):
    """A component container's main loop in a thread."""

    supervisor: Supervisor
    thread: threading.Thread

    def stop(self) -> None:
        self.supervisor.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


Supervise = Callable[[FabricDaemon, HostRoot], Container]


@pytest.fixture
def supervise() -> Iterator[Supervise]:
    started: list[Container] = []

    def start(daemon: FabricDaemon, root: HostRoot) -> Container:
        supervisor = Supervisor(daemon, root, restarts=0, poll=0.01, components=COMPONENTS)
        container = Container(supervisor, threading.Thread(target=supervisor.run, daemon=True))
        container.thread.start()
        started.append(container)
        return container

    yield start
    for container in started:
        container.stop()


def test_a_board_without_a_fabric_is_ready_once_the_driver_and_persistenced_are(
        tmp_path: Path, supervise: Supervise) -> None:
    root = host(tmp_path, H100)  # a PCIe H100: no NVSwitch, no fabric
    gpus_ready = root.local(GPUS_READY_FILE)
    supervise(FabricDaemon(fabric=False), root)

    eventually(root.local(ready_file("fabricmanager")).exists)  # STATE=not-applicable
    stays(lambda: not gpus_ready.exists())  # persistenced is not up yet: neither is the gate
    persistenced_up(root)
    eventually(gpus_ready.exists)
    assert gpus_ready.read_text() == f"DRIVER_VERSION={V}\n"


@pytest.mark.parametrize("gpu", [H100, B200], ids=["hgx-h100-nvswitch", "hgx-b200-nvlink5"])
def test_a_fabric_board_is_not_ready_while_its_fabric_comes_up(
        tmp_path: Path, gpu: int, supervise: Supervise) -> None:
    """driver-ready is there (the driver is verified) but the GPUs would answer CUDA 802 until
    the fabric is up: gpus-ready waits for it, and goes with the container."""
    root = host(tmp_path, gpu)
    persistenced_up(root)
    gpus_ready = root.local(GPUS_READY_FILE)
    daemon = FabricDaemon(fabric=True)
    container = supervise(daemon, root)

    stays(lambda: not gpus_ready.exists())
    assert root.local(READY_FILE).exists()
    daemon.joined.set()
    eventually(gpus_ready.exists)
    assert gpus_ready.read_text() == f"DRIVER_VERSION={V}\n"

    # The container stops (pod deleted, the node drained): its own file goes, and gpus-ready
    # with it.
    container.stop()
    assert not root.local(ready_file("fabricmanager")).exists()
    assert not gpus_ready.exists()


def ready_host(tmp_path: Path) -> HostRoot:
    root = host(tmp_path, H100)
    persistenced_up(root)
    root.write_atomic(ready_file("fabricmanager"),
                      f"DRIVER_VERSION={V}\nSTATE=not-applicable\nREASON=no NVSwitch\n")
    return root


def test_it_goes_when_the_driver_is_unloaded_or_another_is_verified(tmp_path: Path) -> None:
    root = ready_host(tmp_path)
    assert sync_gpus_ready(root, COMPONENTS) is True
    assert root.read_text(GPUS_READY_FILE) == f"DRIVER_VERSION={V}\n"

    (root.local("/proc/driver/nvidia/version")).unlink()  # unloaded by hand
    assert sync_gpus_ready(root, COMPONENTS) is False
    assert not root.local(GPUS_READY_FILE).exists()

    write_driver_version(root.root, V)
    assert sync_gpus_ready(root, COMPONENTS) is True
    root.write_atomic(READY_FILE, READY_TEXT.replace(V, "590.44.01"))  # an upgrade verified
    assert sync_gpus_ready(root, COMPONENTS) is False  # the components are not up for it yet
    assert not root.local(GPUS_READY_FILE).exists()


def test_a_component_that_reports_another_driver_keeps_it_away(tmp_path: Path) -> None:
    root = ready_host(tmp_path)
    root.write_atomic(ready_file("persistenced"), "DRIVER_VERSION=570.1\nSTATE=running\n")
    assert sync_gpus_ready(root, COMPONENTS) is False
    assert not root.local(GPUS_READY_FILE).exists()


def test_the_run_removes_it_with_driver_ready(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from installer.steps import remove_ready_file

    root = ready_host(tmp_path)
    assert sync_gpus_ready(root, COMPONENTS) is True
    remove_ready_file(SimpleNamespace(root=root))  # type: ignore[arg-type]
    assert not root.local(GPUS_READY_FILE).exists() and not root.local(READY_FILE).exists()
