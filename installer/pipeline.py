"""Runs a plan: for each step probe, apply when needed, probe again; one log line per step."""

from __future__ import annotations

import logging
import time

from installer.errors import InstallFailed
from installer.plan import Plan, Step, StepOutcome

log = logging.getLogger(__name__)


def execute(plan: Plan, done: list[StepOutcome] | None = None) -> list[StepOutcome]:
    """Apply every unsatisfied step in order. Raises the first step's error; `done`, when
    given, holds each finished step's outcome by then (the run's outcome record reads it)."""
    outcomes = []
    for step in plan.steps:
        outcomes.append(run_step(step))
        if done is not None:
            done.append(outcomes[-1])
    return outcomes


def run_step(step: Step) -> StepOutcome:
    started = time.monotonic()
    if step.is_satisfied():
        log.info("step %s: already satisfied", step.name, extra={"step": step.name})
        return StepOutcome(step.name, "satisfied", time.monotonic() - started)
    log.info("step %s: %s", step.name, step.summary, extra={"step": step.name})
    step.apply()
    if not step.is_satisfied():
        raise InstallFailed(
            f"step {step.name} finished but its check still fails",
            hint="This is a bug or an unexpected host state; the log above shows what was done.",
        )
    elapsed = time.monotonic() - started
    log.info("step %s: done in %.2f s", step.name, elapsed, extra={"step": step.name})
    return StepOutcome(step.name, "applied", elapsed)
