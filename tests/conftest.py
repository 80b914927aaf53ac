"""Test-wide guard: no test may open a connection beyond loopback; bytecode compiled once;
the xdist groups."""

from __future__ import annotations

import compileall
import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _check_address(sock: socket.socket, address: Any) -> None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    host = address[0] if isinstance(address, tuple) else address
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = ipaddress.ip_address(socket.gethostbyname(host))
    if not ip.is_loopback:
        raise AssertionError(f"test tried to connect to non-loopback address {address!r}")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The package and the test helpers compiled to bytecode once, as pip does for an installed
    package: the suite starts the installer as a process about two thousand times (and the vm
    guests do, 16x slower under TCG), and on a machine with PYTHONDONTWRITEBYTECODE set (this
    one) each start would otherwise compile every module it imports again."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller did it
        return
    repo = Path(__file__).resolve().parents[1]
    for tree in (repo / "installer", repo / "tests"):
        compileall.compile_dir(tree, quiet=1, workers=1)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The real control plane (tests/lib/controlplane.py) boots in the background as soon as
    collection shows a test that wants it, while the tests before it run."""
    if any("control_plane" in getattr(item, "fixturenames", ()) for item in session.items):
        from lib.controlplane import start_in_background

        start_in_background()


def pytest_sessionfinish(session: pytest.Session) -> None:
    import sys

    if "lib.controlplane" in sys.modules:  # only where a test used it
        sys.modules["lib.controlplane"].stop_all()


@pytest.fixture(scope="session")
def control_plane() -> Any:
    """The session's real Kubernetes control plane (skips where scripts/control-plane has not
    built it)."""
    from lib.controlplane import control_plane as running

    return running()


@pytest.fixture(autouse=True)
def network_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def connect(sock: socket.socket, address: Any) -> None:
        _check_address(sock, address)
        _real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        _check_address(sock, address)
        return _real_connect_ex(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield


@pytest.fixture(autouse=True)
def installer_logger_reset() -> Iterator[None]:
    """CLI tests configure the `installer` logger; give every test the default one back."""
    import logging

    logger = logging.getLogger("installer")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    yield
    logger.handlers[:] = saved[0]
    logger.propagate, logger.level = saved[1], saved[2]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `-n`, the long groups first (lib/xdist_groups.py): the scheduler hands the groups out
    in the order the workers collected them."""
    if not hasattr(config, "workerinput"):  # not an xdist worker (they collect, not `-n`'s parent)
        return
    from lib.xdist_groups import long_first

    rank = {nodeid: index for index, nodeid in enumerate(long_first([i.nodeid for i in items]))}
    items.sort(key=lambda item: rank[item.nodeid])


@pytest.hookimpl(optionalhook=True)  # xdist's hook: the suite also runs without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each file a group on one worker, NVIDIA's real compile and the arm64 files one group each
    (lib/xdist_groups.py)."""
    from lib.xdist_groups import make_scheduler

    return make_scheduler(config, log)
