"""The run-outcome record: how each `installer run` ended, what its install took, failure counts."""

from __future__ import annotations

import json
import logging
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
        self.done: list[Any] = []  # pipeline.StepOutcome of each step that finished
        self.started = time.monotonic()


def outcome_path(install_dir: Path) -> Path:
    return install_dir / OUTCOME_FILE


def read(path: Path) -> dict[str, Any] | None:
    """The record at `path`, or None when absent, unreadable or of another format."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != OUTCOME_FORMAT:
        return None
    # The file is on the host, where a person may edit it: keep only counts that are counts.
    failures = data.get("failures")
    data["failures"] = {str(k): v for k, v in failures.items()
                        if isinstance(v, int) and not isinstance(v, bool) and v >= 0
                        } if isinstance(failures, dict) else {}
    return data


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
