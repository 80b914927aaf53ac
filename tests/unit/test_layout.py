"""installer.layout: the install dir reached through the host root, host symlinks included."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lib.fakes import FakeRunner
from lib.hosttrees import make_host, root_env

from installer import planner
from installer.config import from_env
from installer.errors import ConfigError
from installer.hostroot import HostRoot
from installer.layout import Layout


def no_fetch(*args: object) -> Path:
    raise AssertionError("no download expected")


def test_absolute_install_dir_symlink_resolves_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "host"
    make_host(root, gpus=[0x2330])
    (root / "var/lib").mkdir(parents=True)
    os.symlink("/srv/nvidia", root / "var/lib/nvidia")  # the host's /srv, not ours
    layout = Layout.from_config(from_env(root_env(root)), HostRoot(root))
    assert layout.install_local == root / "srv/nvidia"
    assert layout.cache_local == root / "srv/nvidia/cache"
    assert str(layout.install_host) == "/var/lib/nvidia"


def test_cache_dir_symlink_resolves_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "host"
    make_host(root, gpus=[0x2330])
    (root / "mnt/disk").mkdir(parents=True)
    (root / "var").mkdir(parents=True)
    os.symlink("/mnt/disk", root / "var/cache")
    config = from_env(root_env(root, NVIDIA_INSTALLER_CACHE_DIR="/var/cache/nvidia"))
    assert Layout.from_config(config, HostRoot(root)).cache_local == root / "mnt/disk/nvidia"


def test_plan_refuses_an_install_dir_that_resolves_to_a_path_make_would_evaluate(
    tmp_path: Path,
) -> None:
    root = tmp_path / "host"
    make_host(root, gpus=[0x2330])
    (root / "var/lib").mkdir(parents=True)
    os.symlink("/srv/$(touch pwned)", root / "var/lib/nvidia")
    with pytest.raises(ConfigError) as info:
        planner.make_plan(from_env(root_env(root)), FakeRunner(),
                          fetch_bytes=lambda url: b"", fetch_runfile=no_fetch)
    assert info.value.reference == "invalid-config"
    assert "$(touch pwned)" in info.value.message
    assert not (root / "srv").exists()
