"""The unit tier never reads the test machine's own install paths: it passes on a machine that
has GKE's /usr/local/nvidia (the container-side install dir Layout prefers when present)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from kit import sandbox

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sandbox.available(), reason="needs mount namespaces (root)")
def test_unit_tier_passes_on_a_machine_with_usr_local_nvidia(tmp_path: Path) -> None:
    script = (
        "mkdir -p /usr/local/nvidia/lib64 && echo stale > /usr/local/nvidia/state.json && "
        f'exec {sys.executable} -m pytest -q -p no:cacheprovider -x "$@"'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_", "ROOT_MOUNT"))}
    result = sandbox.run(
        ["sh", "-c", script, "sh", "--basetemp", str(tmp_path / "t"), str(REPO / "tests/unit")],
        work=tmp_path / "sandbox",
        overlays=["/usr/local"],
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert (sandbox.upper_dir(tmp_path / "sandbox", "/usr/local") / "nvidia").is_dir()


@pytest.mark.skipif(not sandbox.available(), reason="needs mount namespaces (root)")
def test_unit_tier_passes_on_a_machine_without_kernel_headers(tmp_path: Path) -> None:
    """The image's header trees are posed by the unit tier (tests/unit/conftest.py), never
    inherited: an empty /usr/src changes no outcome."""
    empty = tmp_path / "empty-usr-src"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_", "ROOT_MOUNT"))}
    result = sandbox.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "--basetemp", str(tmp_path / "t"), str(REPO / "tests/unit")],
        work=tmp_path / "sandbox",
        binds={"/usr/src": empty},
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
