"""The multi-arch build's buildah storage is kept outside the clone between CI runs
(pod/multiarch.py CachedBuildah), and a CI run can be killed at its time limit anywhere: the next
run starts from whatever the killed one left."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest

from pod.multiarch import CachedBuildah

# What images/build.sh names its manifest list for the Debian 12 image (REGISTRY/IMAGE:TAG-name).
LIST = "localhost/nvidia-driver-installer:ci-debian12"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("buildah") is None,
                                reason="buildah with vfs storage needs root (scripts/install-deps)")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INSTALLER_CI_CACHE", str(tmp_path / "ci-cache"))
    return tmp_path / "ci-cache"


def test_a_killed_runs_manifest_list_and_containers_are_gone_for_the_next(cache: Path) -> None:
    killed = CachedBuildah()
    killed("manifest", "create", LIST)  # build.sh's first step, then the run was killed
    killed("from", "scratch")
    base_list = "localhost/installer-ci-base:debian12-half-made"
    killed("manifest", "create", base_list)  # an import of the bases cut short
    killed.release()  # its process is gone, and its lock with it

    next_run = CachedBuildah()
    assert next_run.storage == killed.storage
    assert next_run("containers", "--quiet") == ""
    assert not next_run.has_list(base_list)
    next_run("manifest", "create", LIST)  # refused ("already associated") before the repair
    next_run("manifest", "create", base_list)


def test_a_storage_buildah_cannot_use_starts_afresh(cache: Path) -> None:
    broken = CachedBuildah()
    broken("from", "scratch")
    layers = broken.storage / "root/vfs-layers"
    shutil.rmtree(layers)
    layers.write_text("")  # buildah can no longer delete the container, or write a layer
    broken.release()

    next_run = CachedBuildah()
    assert json.loads(next_run("images", "--all", "--json") or "[]") == []
    next_run("rm", next_run("from", "scratch"))
    assert next_run("containers", "--quiet") == ""


def test_a_second_run_on_the_machine_waits_for_the_first(cache: Path) -> None:
    first = CachedBuildah()
    with (cache / "multiarch-buildah.lock").open("a") as second:
        with pytest.raises(BlockingIOError):
            fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
        first.release()
        fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
