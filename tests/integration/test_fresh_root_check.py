"""scripts/fresh-root-check's refusals, before it makes anything: it needs the machine image's
package list and says so (its real run, minutes long, is recorded in bench/RESULTS.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "fresh-root-check"


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "FRESH_ROOT_PACKAGES"}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          check=False,
                          env={**base, "FRESH_ROOT_CACHE": str(tmp_path / "cache"), **env})


def test_without_a_package_list_it_names_what_it_needs(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.returncode == 2
    assert "FRESH_ROOT_PACKAGES" in result.stderr
    assert "installed-go.txt" in result.stderr
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_list_that_is_not_there_is_refused(tmp_path: Path, how: str) -> None:
    missing = tmp_path / "installed-none.txt"
    result = (_run(tmp_path, str(missing)) if how == "argument"
              else _run(tmp_path, FRESH_ROOT_PACKAGES=str(missing)))
    assert result.returncode == 2
    assert f"no package list at {missing}" in result.stderr
    assert not (tmp_path / "cache").exists()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mmdebstrap") is None,
                    reason="needs root and mmdebstrap (scripts/install-deps)")
def test_a_list_without_apt_packages_is_refused(tmp_path: Path) -> None:
    pip_only = tmp_path / "installed-pip.txt"
    pip_only.write_text("# kinds: none\npip 3.11\tpytest\t8.0\n")
    result = _run(tmp_path, str(pip_only))
    assert result.returncode == 2
    assert "lists no apt package" in result.stderr
    assert not list((tmp_path / "cache").glob("root-*"))
