"""CI's `-n 2` keeps each group on one worker (tests/lib/xdist_groups.py): a posed suite with the
suite's own conftest and pytest settings, run by the installed pytest and xdist, records which
worker ran each module's fixture."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from lib.xdist_groups import group_of_nodeid

REPO = Path(__file__).resolve().parents[2]

POSED = ("integration/test_cross_build.py", "vm/test_arm64_vm.py", "vm/test_arm64_node_vm.py",
         "integration/test_real_driver.py", "vm/test_real_driver_vm.py",
         "pod/test_multiarch_image.py", "unit/test_one.py", "unit/test_two.py")

MODULE = '''
import os
import pytest

@pytest.fixture(scope="module")
def once():
    with open(os.environ["FIXTURE_LOG"], "a") as log:
        log.write(f"{__file__} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.parametrize("case", range(4))
def test_case(once, case):
    pass
'''


def test_node_ids_map_to_their_groups() -> None:
    assert group_of_nodeid("tests/vm/test_arm64_vm.py::test_boot[x]") == "arm64"
    assert group_of_nodeid("integration/test_cross_build.py::test_a") == "arm64"
    assert group_of_nodeid("tests/vm/test_real_driver_vm.py::T::test_a") == "real-driver"
    assert group_of_nodeid("tests/unit/test_cli.py::test_a") == "unit/test_cli.py"


def test_two_workers_run_each_group_once_on_one_worker(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    suite = tmp_path / "suite"
    (suite / "tests").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", suite)
    shutil.copy(REPO / "tests" / "conftest.py", suite / "tests")
    (suite / "tests" / "lib").symlink_to(REPO / "tests" / "lib")
    for name in POSED:
        module = suite / "tests" / name
        module.parent.mkdir(exist_ok=True)
        module.write_text(MODULE)
    log = tmp_path / "fixtures.log"

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "tests"],
        cwd=suite, env={**os.environ, "FIXTURE_LOG": str(log)}, capture_output=True, text=True,
        timeout=300, check=False)

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{4 * len(POSED)} passed" in result.stdout
    ran = [line.split() for line in log.read_text().splitlines()]
    modules = [Path(path).relative_to(suite / "tests").as_posix() for path, _ in ran]
    assert sorted(modules) == sorted(POSED)  # every module's fixture once
    workers = defaultdict(set)
    for module, (_, worker) in zip(modules, ran, strict=True):
        workers[group_of_nodeid(module)].add(worker)
    assert all(len(seen) == 1 for seen in workers.values()), dict(workers)
    assert set(workers) == {"arm64", "real-driver", "pod/test_multiarch_image.py",
                            "unit/test_one.py", "unit/test_two.py"}
