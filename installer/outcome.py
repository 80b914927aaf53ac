"""The run-outcome record: how each `installer run` ended, what its install took, failure counts."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from installer.hostroot import write_atomic

log = logging.getLogger(__name__)

OUTCOME_FORMAT = 1
OUTCOME_FILE = "last-run.json"  # in the install dir, beside state.json (it survives reboots)
# The reference counted for a failure that is no InstallerError (a bug: exit status 1).
UNEXPECTED = "unexpected-error"
# Which applied step says where this run's kernel modules came from; a run that applied steps
# but none of these reused modules already in the cache.
_MODULE_PRODUCERS = (("build-modules", "compiled"), ("install-driver-packages", "compiled"),
                     ("use-prebuilt-modules", "pulled"))


class Progress:
    """What a run got to: filled in by app.run as it goes, read when it ends either way."""

    def __init__(self) -> None:
        self.install_dir: Optional[Path] = None
        self.target: Any = None  # plan.Target once the plan is made
        self.steps: list[str] = []  # every step the run would go through, in order
        self.done: list[Any] = []  # plan.StepOutcome of each step that finished
        self.started = time.monotonic()


def outcome_path(install_dir: Path) -> Path:
    return install_dir / OUTCOME_FILE


def read(path: Path) -> dict[str, Any] | None:
    """The record at `path`, or None when absent, unreadable, of another format or malformed."""
    return load(path)[0]


def load(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The record at `path` and what is wrong with it: (record, "") when well-formed,
    (None, "") when absent, (None, problem) when it cannot be read or a field is malformed.
    The file is on the host, where anything may have written it: raises nothing."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({exc})"
    try:
        data = json.loads(text)
    except ValueError:
        return None, "not JSON"
    problem = _problem(data)
    return (None, problem) if problem else (data, "")


_STR_FIELDS = ("error", "failed_step", "version", "flavour", "kernel", "source", "modules",
               "finished_at")


def _problem(data: object) -> str:
    """What makes `data` no run-outcome record ("" when it is one). Every field the metrics
    and `installer status` show is checked for its type: a record is whole or not at all."""
    if not isinstance(data, dict):
        return f"not a JSON object but {type(data).__name__}"
    if data.get("format") != OUTCOME_FORMAT:
        return f"format {data.get('format')!r} is not {OUTCOME_FORMAT}"
    if data.get("outcome", "success") not in ("success", "failure"):
        return "outcome is neither success nor failure"
    for key in _STR_FIELDS:
        if not isinstance(data.get(key, ""), str):
            return f"{key} is not a string"
    if not _seconds(data.get("seconds", 0)):
        return "seconds is not a number of seconds"
    phases = data.get("phases", {})
    if not isinstance(phases, dict):
        return "phases is not an object"
    for phase, seconds in phases.items():
        if not _seconds(seconds):
            return f"phases.{phase} is not a number of seconds"
    failures = data.get("failures", {})
    if not isinstance(failures, dict):
        return "failures is not an object"
    for reference, count in failures.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return f"failures.{reference} is not a count"
    return ""


def _seconds(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def modules_source(done: Sequence[Any]) -> str:
    """compiled, pulled or cached: how the modules of a run that applied steps came to be."""
    applied = {step.name for step in done if step.status == "applied"}
    for name, source in _MODULE_PRODUCERS:
        if name in applied:
            return source
    return "cached"


def next_record(previous: dict[str, Any] | None, progress: Progress,
                error: BaseException | None, now: str) -> dict[str, Any]:
    """The record after this run. A run that changed nothing and succeeded (the warm path)
    gives back `previous` unchanged: the last install's phases stay what they were."""
    record: dict[str, Any] = dict(previous or {})
    record.setdefault("failures", {})
    record["format"] = OUTCOME_FORMAT
    applied = [s for s in progress.done if s.status == "applied"]
    target = progress.target
    if target is not None:
        record.update(version=target.version, flavour=target.flavour, kernel=target.kernel,
                      source=target.source)
    if error is None:
        record.update(outcome="success", error="", failed_step="")
    else:
        reference = getattr(error, "reference", UNEXPECTED)
        failures = dict(record["failures"])
        failures[reference] = int(failures.get(reference, 0)) + 1
        failed = (progress.steps[len(progress.done)]
                  if len(progress.done) < len(progress.steps) else "")
        record.update(outcome="failure", error=reference, failed_step=failed,
                      failures=failures)
    if applied or error is not None:
        # This run changed the host (or tried to): its phases are the last install's.
        record.update(
            phases={s.name: round(s.seconds, 3) for s in applied},
            modules=modules_source(applied) if applied else record.get("modules", ""),
            seconds=round(time.monotonic() - progress.started, 3),
            finished_at=now,
        )
    return record


def record_run(progress: Progress, error: BaseException | None) -> None:
    """Write this run's outcome into `<install dir>/last-run.json` (atomically, and not at all
    when nothing changed). Only where the install dir exists: a refusal before the first
    install creates nothing. Never raises: the run's own result is what the caller reports."""
    if progress.install_dir is None or not progress.install_dir.is_dir():
        return
    path = outcome_path(progress.install_dir)
    previous = read(path)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        record = next_record(previous, progress, error, now)
    except Exception as exc:  # whatever the record holds must not mask the run's own error
        log.warning("could not record the run's outcome in %s: %s", path, exc)
        return
    if record == previous:
        return
    try:
        write_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    except OSError as exc:  # a read-only or full install dir must not hide the run's result
        log.warning("could not write the run's outcome to %s: %s", path, exc)
