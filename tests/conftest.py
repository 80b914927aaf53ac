"""Test-wide guard: no test may open a connection beyond loopback."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
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
