"""The fabricmanager container's log on an NVLink5 node: NVLSM's lines under NVLSM's name (the
pair shares one line callback), Fabric Manager's under its own."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from lib.hosttrees import make_host, root_env

from installer.components import fabricmanager_daemon
from installer.config import from_env


def test_nvlsm_lines_are_not_logged_as_fabric_managers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_host(tmp_path)
    daemon = fabricmanager_daemon.FabricManagerDaemon(from_env(root_env(tmp_path)), root, env={})
    caplog.set_level(logging.INFO, logger=fabricmanager_daemon.__name__)
    try:
        daemon._line("nvlsm: [nvlsm] SUBNET UP")
        daemon._line("[INFO] Connected to 1 node.")
    finally:
        daemon.close()
    assert [r.getMessage() for r in caplog.records] == [
        "nvlsm: [nvlsm] SUBNET UP", "nv-fabricmanager: [INFO] Connected to 1 node."]
    # Both stay in the tail a failure message quotes (an NVLSM that cannot bind says why).
    assert list(daemon.tail) == ["nvlsm: [nvlsm] SUBNET UP", "[INFO] Connected to 1 node."]
