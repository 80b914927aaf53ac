"""The run-outcome record: every run leaves one (success or failure, counted by reference), a
run that changed nothing writes nothing, and a refusal before the first install creates
nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from lib.fakes import FakeRunner
from lib.hosttrees import make_host, root_env

from installer import app, outcome
from installer.config import from_env
from installer.errors import LockTimeout, NoNvidiaGpu
from installer.plan import StepOutcome

INSTALL = "/var/lib/nvidia"
TARGET = SimpleNamespace(version="580.105.08", flavour="open", kernel="6.1.0-28-amd64",
                         source="runfile")
STEPS = ["fetch-runfile", "use-prebuilt-modules", "build-modules", "load-modules",
         "verify-driver"]


def progress(tmp_path: Path, done: list[StepOutcome], target: object = TARGET
             ) -> outcome.Progress:
    made = outcome.Progress()
    made.install_dir, made.target, made.steps, made.done = tmp_path, target, STEPS, done
    return made


def applied(*names: str) -> list[StepOutcome]:
    return [StepOutcome(name, "applied", 1.5) for name in names]


def test_a_successful_install_records_its_phases_and_modules_source(tmp_path: Path) -> None:
    outcome.record_run(progress(tmp_path, applied("fetch-runfile", "build-modules")), None)
    record = json.loads((tmp_path / "last-run.json").read_text())
    assert record["outcome"] == "success" and record["error"] == ""
    assert record["phases"] == {"fetch-runfile": 1.5, "build-modules": 1.5}
    assert record["modules"] == "compiled"
    assert (record["version"], record["flavour"], record["kernel"], record["source"]) == (
        "580.105.08", "open", "6.1.0-28-amd64", "runfile")
    assert record["failures"] == {}


@pytest.mark.parametrize(("steps", "source"), [
    (("use-prebuilt-modules", "load-modules"), "pulled"),
    (("use-prebuilt-modules", "build-modules"), "compiled"),  # nothing matched: compiled
    (("load-modules",), "cached"),
    (("install-driver-packages",), "compiled"),  # dnf: DKMS builds them
])
def test_modules_source(steps: tuple[str, ...], source: str) -> None:
    assert outcome.modules_source(applied(*steps)) == source


def test_a_warm_run_writes_nothing(tmp_path: Path) -> None:
    outcome.record_run(progress(tmp_path, applied("build-modules")), None)
    path = tmp_path / "last-run.json"
    before = path.stat()
    warm = [StepOutcome(name, "satisfied", 0.001) for name in STEPS]
    outcome.record_run(progress(tmp_path, warm), None)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert json.loads(path.read_text())["phases"] == {"build-modules": 1.5}


def test_failures_are_counted_by_reference_across_runs(tmp_path: Path) -> None:
    path = tmp_path / "last-run.json"
    outcome.record_run(progress(tmp_path, applied("build-modules")), None)
    failed_at_load = applied("fetch-runfile", "use-prebuilt-modules", "build-modules")
    outcome.record_run(progress(tmp_path, failed_at_load), LockTimeout("held"))
    assert json.loads(path.read_text())["failed_step"] == "load-modules"
    outcome.record_run(progress(tmp_path, []), LockTimeout("held"))
    outcome.record_run(progress(tmp_path, []), RuntimeError("a bug"))
    record = json.loads(path.read_text())
    assert record["failures"] == {"lock-timeout": 2, outcome.UNEXPECTED: 1}
    assert (record["outcome"], record["error"], record["failed_step"]) == (
        "failure", outcome.UNEXPECTED, "fetch-runfile")
    outcome.record_run(progress(tmp_path, applied("fetch-runfile")), LockTimeout("held"))
    assert json.loads(path.read_text())["failed_step"] == "use-prebuilt-modules"
    # A success afterwards keeps the counts: they are counters across runs.
    outcome.record_run(progress(tmp_path, applied("load-modules", "verify-driver")), None)
    record = json.loads(path.read_text())
    assert record["outcome"] == "success" and record["failures"]["lock-timeout"] == 3


def test_a_broken_record_starts_again(tmp_path: Path) -> None:
    (tmp_path / "last-run.json").write_text("{not json")
    outcome.record_run(progress(tmp_path, []), LockTimeout("held"))
    assert json.loads((tmp_path / "last-run.json").read_text())["failures"] == {
        "lock-timeout": 1}


@pytest.mark.parametrize("failures", [None, [], "3", {"lock-timeout": "many"},
                                      {"lock-timeout": None, "no-nvidia-gpu": 2}])
def test_a_hand_edited_record_never_makes_record_run_raise(tmp_path: Path,
                                                          failures: object) -> None:
    path = tmp_path / "last-run.json"
    path.write_text(json.dumps({"format": outcome.OUTCOME_FORMAT, "failures": failures}))
    outcome.record_run(progress(tmp_path, []), LockTimeout("held"))
    counts = json.loads(path.read_text())["failures"]
    assert counts["lock-timeout"] == 1  # what could not be read as a count starts again
    assert counts.get("no-nvidia-gpu", 2) == 2  # the valid counts are kept


def test_record_run_only_warns_when_the_record_cannot_be_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(*_: object) -> dict[str, object]:
        raise TypeError("unsupported operand")

    monkeypatch.setattr(outcome, "next_record", broken)
    outcome.record_run(progress(tmp_path, []), LockTimeout("held"))
    assert "could not record the run's outcome" in caplog.text
    assert not (tmp_path / "last-run.json").exists()


def test_a_refused_run_is_recorded_where_the_install_dir_exists(tmp_path: Path) -> None:
    root = tmp_path / "host"
    make_host(root, distro="ubuntu-22.04", gpus=[])
    install = root / INSTALL.lstrip("/")
    install.mkdir(parents=True)
    config = from_env(root_env(root, NVIDIA_INSTALL_DIR_HOST=INSTALL))
    for _ in range(2):
        with pytest.raises(NoNvidiaGpu):
            app.run(config, FakeRunner())
    record = json.loads((install / "last-run.json").read_text())
    assert (record["outcome"], record["error"]) == ("failure", "no-nvidia-gpu")
    assert record["failed_step"] == ""  # refused by the plan: no step was reached
    assert record["failures"] == {"no-nvidia-gpu": 2}
    assert sorted(os.listdir(install)) == ["last-run.json"]  # no lock: refused before it
    assert app.status(config)["last_run"] == record  # what `installer status` shows
