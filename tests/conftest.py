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


# CI runs the suite on two xdist workers (`-n 2`, README). Each file is a group (its module
# fixtures, a vm scenario's boots among them, run once), except NVIDIA's real compile, whose three
# files share one build (tests/lib/realdriver.py). The longest groups are handed out first, longest
# first, so that neither worker is left with a long one at the end.
REAL_DRIVER_FILES = ("integration/test_real_driver.py", "integration/test_real_registry.py",
                     "vm/test_real_driver_vm.py")
# The arm64 files (NVIDIA's real arm64 modules cross-built, the arm64 guest) share one worker:
# lib/arm64kit.py packs the aarch64 .run once per worker.
ARM64_FILES = ("integration/test_cross_build.py", "vm/test_arm64_vm.py",
               "vm/test_arm64_node_vm.py")
LONG_GROUPS = ("vm/test_pod_scenarios.py", "real-driver", "arm64", "pod/test_multiarch_image.py",
               "integration/test_real_driver_trixie.py",
               "vm/test_installer_scenarios.py",
               "vm/test_headers_fetched.py", "vm/test_upgrade_protocol.py",
               "vm/test_next_kernel_vm.py", "vm/test_dnf_scenario.py", "vm/test_prebuilt_vm.py",
               "integration/test_hosts_2026_run.py")


def xdist_group_of(path: str) -> str:
    """The xdist group of a test file, given as a path relative to tests/."""
    if path in ARM64_FILES:
        return "arm64"
    return "real-driver" if path in REAL_DRIVER_FILES else path


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the marks into groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker (they collect, not `-n`'s parent)
        return
    tests_dir = Path(__file__).parent
    groups = {}
    for item in items:
        group = xdist_group_of(item.path.relative_to(tests_dir).as_posix())
        item.add_marker(pytest.mark.xdist_group(group))
        groups[item.nodeid] = group
    order = {name: index for index, name in enumerate(LONG_GROUPS)}
    items.sort(key=lambda item: order.get(groups[item.nodeid], len(order)))
