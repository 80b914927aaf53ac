"""The next kernel's modules in the install dir's cache: whether they are there, getting them
(as `installer prebuild --kernel K` does, a registry artifact first) and the record of the last
attempt, `<cache>/next-kernel.json`."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from installer import state
from installer.config import Config
from installer.errors import InstallerError
from installer.hostroot import write_atomic
from installer.layout import Layout
from installer.plan import Plan
from installer.runner import Runner

log = logging.getLogger(__name__)

RECORD_NAME = "next-kernel.json"
# What `installer prebuild` runs, plus the registry pull before and the publish after it, and
# the compiler check a run makes (it installs the kernel's gcc into the image when needed).
# `app.build_modules`, passed in (the app sits above the planner, which lists our step): plan
# for the config's kernel and run the named steps of that plan.
BuildModules = Callable[[Config, Runner, "tuple[str, ...]"], Plan]
PREPARE_STEPS = ("use-prebuilt-modules", "kernel-headers", "check-compiler", "fetch-runfile",
                 "extract-runfile", "build-modules", "publish-modules")


def modules_ready(layout: Layout, version: str, kernel: str, flavour: str) -> bool:
    """The cache holds a complete build of `version` for `kernel` (what build-modules checks)."""
    from installer.dirs import COMPLETE_MARKER
    from installer.sources import installed

    build = layout.module_build(version, kernel, flavour)
    return (build / COMPLETE_MARKER).is_file() and installed.module_version_matches(
        build / "nvidia.ko", version)


def origin(layout: Layout, version: str, kernel: str, flavour: str) -> str:
    from installer.sources.prebuilt import key

    marker = layout.module_build(version, kernel, flavour) / key.ARTIFACT_MARKER
    return f"pulled {marker.read_text().strip()}" if marker.is_file() else "compiled"


# --- the record ------------------------------------------------------------------------------


def record_path(layout: Layout) -> Path:
    return layout.cache_local / RECORD_NAME


def read_attempt(layout: Layout) -> dict[str, Any] | None:
    """The last attempt's record, or None (absent or unreadable: a hint, never the truth)."""
    try:
        data = json.loads(record_path(layout).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_attempt(layout: Layout, kernel: str, version: str, flavour: str, outcome: str,
                   seconds: float, error: dict[str, str] | None = None,
                   origin: str = "") -> None:
    data: dict[str, Any] = {
        "kernel": kernel, "version": version, "flavour": flavour, "state": outcome,
        "origin": origin, "seconds": round(seconds, 2), "at": state.utc_now(), "error": error,
    }
    try:
        write_atomic(record_path(layout), json.dumps(data, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        log.warning("could not record the next kernel's preparation in %s: %s",
                    record_path(layout), exc)


# --- preparing -------------------------------------------------------------------------------


def prepare(config: Config, runner: Runner, kernel: str, version: str, flavour: str,
            build: BuildModules) -> str:
    """Modules of `version` (`flavour`) for `kernel` into the install dir's cache: pulled from
    the module registry when an artifact matches, else compiled against the kernel's headers
    (fetched into the cache when the host has none), as `installer prebuild --kernel` does;
    published when pushing is on. Installs and loads nothing. The caller holds the host lock.
    Returns where the modules came from; raises the build's errors."""
    from installer import sources

    pinned = replace(config, kernel_release=kernel, version=version, module_type=flavour,
                     source=sources.module_builder().name, allow_no_gpu=True,
                     next_kernel="off")
    plan = build(pinned, runner, PREPARE_STEPS)
    return origin(plan.context.layout, version, kernel, flavour)


def prepare_recorded(config: Config, runner: Runner, layout: Layout, kernel: str,
                     version: str, flavour: str, build: BuildModules) -> None:
    """`prepare` with its log lines and its record, failed or ready. Raises what it raises."""
    started = time.monotonic()
    log.info("next kernel %s is installed: getting the modules of %s (%s) for it into the "
             "cache", kernel, version, flavour)
    try:
        source = prepare(config, runner, kernel, version, flavour, build)
    except InstallerError as exc:
        record_failure(layout, kernel, version, flavour, started, exc.reference, exc.message)
        raise
    seconds = time.monotonic() - started
    _write_attempt(layout, kernel, version, flavour, "ready", seconds, origin=source)
    log.info("next kernel %s: modules ready in %.1f s (%s); booting it loads them with no "
             "compile and no download", kernel, seconds, source)


def prepare_guarded(config: Config, runner: Runner, layout: Layout, kernel: str, version: str,
                    flavour: str, build: BuildModules) -> bool:
    """`prepare` inside a run: every failure becomes a warning naming its error reference and
    a record; nothing is raised. Returns whether the modules are ready."""
    started = time.monotonic()
    try:
        prepare_recorded(config, runner, layout, kernel, version, flavour, build)
    except InstallerError:
        return False  # warned and recorded
    except Exception as exc:  # the current driver must never pay for a bug here
        log.debug("preparing the next kernel failed", exc_info=True)
        record_failure(layout, kernel, version, flavour, started, "unexpected",
                f"{type(exc).__name__}: {exc}")
        return False
    return True


def record_failure(layout: Layout, kernel: str, version: str, flavour: str, started: float,
            reference: str, message: str) -> None:
    _write_attempt(layout, kernel, version, flavour, "failed", time.monotonic() - started,
                   {"reference": reference, "message": message})
    log.warning("next kernel %s: modules not prepared (error[%s]: %s); the installed driver is "
                "not affected, and the first boot of %s builds them then", kernel, reference,
                message, kernel)


