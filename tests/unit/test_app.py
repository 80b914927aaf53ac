"""A refused plan changes nothing: `run` creates no install dir and no lock file when planning
already says no (a node that refuses must be left as it was)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lib.fakes import FakeRunner
from lib.hosttrees import make_host, root_env

from installer import app
from installer.config import from_env
from installer.errors import (
    InstallerError,
    InvalidVersion,
    NoNvidiaGpu,
    SecureBootKeysMissing,
    UnsupportedDistro,
)

INSTALL = "/var/lib/nvidia"


def snapshot(root: Path) -> set[str]:
    found = set()
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(directory, name), root))
    return found


@pytest.mark.parametrize(
    ("host", "env", "error"),
    [
        ({"gpus": [0x2330]}, {"NVIDIA_DRIVER_VERSION": "5\u0665\u0660.54.15"}, InvalidVersion),
        ({"gpus": [0x2330], "distro": None}, {}, UnsupportedDistro),
        ({"gpus": []}, {}, NoNvidiaGpu),
        ({"gpus": [0x2330], "secure_boot": True}, {}, SecureBootKeysMissing),
    ],
    ids=["invalid-version", "unsupported-distro", "no-gpu", "secure-boot"],
)
def test_refused_run_creates_no_install_dir_and_no_lock(
    tmp_path: Path, host: dict[str, object], env: dict[str, str], error: type[InstallerError]
) -> None:
    root = tmp_path / "host"
    distro = host.pop("distro", "ubuntu-22.04")
    make_host(root, distro="debian-12" if distro is None else str(distro),
              **host)  # type: ignore[arg-type]
    if distro is None:
        (root / "etc/os-release").unlink()
        (root / "usr/lib/os-release").unlink(missing_ok=True)
    before = snapshot(root)
    config = from_env(root_env(root, NVIDIA_INSTALL_DIR_HOST=INSTALL, **env))
    runner = FakeRunner()
    with pytest.raises(error):
        app.run(config, runner)
    assert not (root / INSTALL.lstrip("/")).exists()
    assert snapshot(root) == before
    assert runner.calls == []
