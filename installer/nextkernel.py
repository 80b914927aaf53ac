"""The next kernel before the reboot: find a newer kernel installed on the host and get the
installed driver's modules for it into the cache, so booting it is the warm path.

A kernel is pending when `/lib/modules/<K>/modules.dep` and `/boot/vmlinuz-<K>` both exist
(what a kernel package's install leaves; a removed kernel's leftover module dir has no
modules.dep) and it is newer than the kernel this run installs for, of the same flavour
(`-amd64` stays `-amd64`, `-aws` stays `-aws`, `+debug` stays `+debug`). Only the newest counts.
Getting its modules is what `installer prebuild --kernel K` does (a registry artifact when one
matches, else a compile against its headers, fetched when missing), run after the current
driver is verified; a failure there only warns and is recorded in `<cache>/next-kernel.json`.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from installer import host, state
from installer.config import Config
from installer.errors import InstallerError
from installer.hostroot import HostRoot, write_atomic
from installer.layout import Layout
from installer.plan import Context, Decision, Step
from installer.runner import Runner

log = logging.getLogger(__name__)

RECORD_NAME = "next-kernel.json"
STEP_NAME = "prepare-next-kernel"
# What `installer prebuild` runs, plus the registry pull before and the publish after it, and
# the compiler check a run makes (it installs the kernel's gcc into the image when needed).
PREPARE_STEPS = ("use-prebuilt-modules", "kernel-headers", "check-compiler", "fetch-runfile",
                 "extract-runfile", "build-modules", "publish-modules")
_RELEASE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}$")
_NUMBERS = re.compile(r"^\d+(?:[.-]\d+)*")
# A distro tag between the numbers and the architecture (.el9_4., .fc41., .amzn2023.) changes
# with every minor release: it is not part of the flavour.
_DISTRO_TAG = re.compile(r"\.[a-z]+\d+(?:_\d+)*(?=\.)")


# --- which kernel ----------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class ReleaseKey:
    """A kernel release split into its numbers (compared as numbers) and its flavour."""

    numbers: tuple[int, ...]
    flavour: str


def release_key(release: str) -> ReleaseKey | None:
    """`6.1.0-56-amd64` -> ((6, 1, 0, 56), "-amd64"); `5.14.0-427.13.1.el9_4.x86_64` ->
    ((5, 14, 0, 427, 13, 1), ".x86_64"); None when the release does not start with numbers."""
    found = _NUMBERS.match(release)
    if found is None:
        return None
    numbers = tuple(int(n) for n in re.split(r"[.-]", found.group(0)))
    return ReleaseKey(numbers, _DISTRO_TAG.sub("", release[found.end():]))


def _numbers(release: str) -> tuple[int, ...]:
    key = release_key(release)
    return key.numbers if key else ()


def is_newer(candidate: str, current: str) -> bool:
    """`candidate` is a later release of the same flavour as `current`."""
    new, old = release_key(candidate), release_key(current)
    return (new is not None and old is not None and new.flavour == old.flavour
            and new.numbers > old.numbers)


def is_installed(root: HostRoot, release: str) -> bool:
    """Both files a kernel package's install leaves are there (read-only)."""
    return (root.local_resolved(f"/lib/modules/{release}/modules.dep").is_file()
            and root.local_resolved(f"/boot/vmlinuz-{release}").is_file())


def pending_kernel(root: HostRoot, current: str, running: str | None = None) -> str | None:
    """The newest kernel installed on the host that is newer than `current` (the kernel the run
    installs for), other than `running`; None when there is none. Reads only."""
    modules = root.local_resolved("/lib/modules")
    try:
        names = [entry.name for entry in modules.iterdir()]
    except OSError:
        return None
    found = [name for name in names
             if _RELEASE.fullmatch(name) and name not in (current, running)
             and is_newer(name, current) and is_installed(root, name)]
    return max(found, key=_numbers) if found else None


# --- its modules -----------------------------------------------------------------------------


def modules_ready(layout: Layout, version: str, kernel: str, flavour: str) -> bool:
    """The cache holds a complete build of `version` for `kernel` (what build-modules checks)."""
    from installer.sources.runfile import module_version_matches
    from installer.steps import COMPLETE_MARKER

    build = layout.module_build(version, kernel, flavour)
    return (build / COMPLETE_MARKER).is_file() and module_version_matches(build / "nvidia.ko",
                                                                          version)


def _origin(layout: Layout, version: str, kernel: str, flavour: str) -> str:
    from installer.sources.prebuilt import ARTIFACT_MARKER

    marker = layout.module_build(version, kernel, flavour) / ARTIFACT_MARKER
    return f"pulled {marker.read_text().strip()}" if marker.is_file() else "compiled"


def _dnf_modules_present(root: HostRoot, kernel: str) -> bool:
    from installer.sources import dnf_commands

    return "nvidia" in dnf_commands.module_files(root, kernel)


DNF_REASON = (
    "the installer does not prepare it on dnf hosts: with a DKMS stream the host's DKMS builds "
    "for a newly installed kernel itself (its kernel install hook, dkms autoinstall) when "
    "kernel-devel of that kernel is installed; a precompiled stream needs NVIDIA's "
    "kmod-nvidia-<version>-<kernel> package, which only a dnf transaction on the host puts "
    "there, and the installer runs none outside an install"
)


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


def prepare(config: Config, runner: Runner, kernel: str, version: str, flavour: str) -> str:
    """Modules of `version` (`flavour`) for `kernel` into the install dir's cache: pulled from
    the module registry when an artifact matches, else compiled against the kernel's headers
    (fetched into the cache when the host has none), as `installer prebuild --kernel` does;
    published when pushing is on. Installs and loads nothing. The caller holds the host lock.
    Returns where the modules came from; raises the build's errors."""
    from installer import app

    pinned = replace(config, kernel_release=kernel, version=version, module_type=flavour,
                     source="runfile", allow_no_gpu=True, next_kernel="off")
    plan = app.build_modules(pinned, runner, PREPARE_STEPS)
    return _origin(plan.context.layout, version, kernel, flavour)


def _prepare_recorded(config: Config, runner: Runner, layout: Layout, kernel: str,
                      version: str, flavour: str) -> None:
    """`prepare` with its log lines and its record, failed or ready. Raises what it raises."""
    started = time.monotonic()
    log.info("next kernel %s is installed: getting the modules of %s (%s) for it into the "
             "cache", kernel, version, flavour)
    try:
        origin = prepare(config, runner, kernel, version, flavour)
    except InstallerError as exc:
        _failed(layout, kernel, version, flavour, started, exc.reference, exc.message)
        raise
    seconds = time.monotonic() - started
    _write_attempt(layout, kernel, version, flavour, "ready", seconds, origin=origin)
    log.info("next kernel %s: modules ready in %.1f s (%s); booting it loads them with no "
             "compile and no download", kernel, seconds, origin)


def prepare_guarded(config: Config, runner: Runner, layout: Layout, kernel: str, version: str,
                    flavour: str) -> bool:
    """`prepare` inside a run: every failure becomes a warning naming its error reference and
    a record; nothing is raised. Returns whether the modules are ready."""
    started = time.monotonic()
    try:
        _prepare_recorded(config, runner, layout, kernel, version, flavour)
    except InstallerError:
        return False  # warned and recorded
    except Exception as exc:  # the current driver must never pay for a bug here
        log.debug("preparing the next kernel failed", exc_info=True)
        _failed(layout, kernel, version, flavour, started, "unexpected",
                f"{type(exc).__name__}: {exc}")
        return False
    return True


def _failed(layout: Layout, kernel: str, version: str, flavour: str, started: float,
            reference: str, message: str) -> None:
    _write_attempt(layout, kernel, version, flavour, "failed", time.monotonic() - started,
                   {"reference": reference, "message": message})
    log.warning("next kernel %s: modules not prepared (error[%s]: %s); the installed driver is "
                "not affected, and the first boot of %s builds them then", kernel, reference,
                message, kernel)


# --- in the plan -----------------------------------------------------------------------------


def _pending(ctx: Context) -> str | None:
    if "next-kernel" not in ctx.memo:
        ctx.memo["next-kernel"] = pending_kernel(ctx.root, ctx.target.kernel,
                                                 host.kernel_release(ctx.root))
    found = ctx.memo["next-kernel"]
    assert found is None or isinstance(found, str)
    return found


def decision(ctx: Context) -> Decision:
    """What `installer plan` says about the next kernel. Reads only."""
    t = ctx.target
    pending = _pending(ctx)
    if pending is None:
        return Decision("next-kernel", "none",
                        f"no kernel newer than {t.kernel} is installed (both "
                        "/lib/modules/<k>/modules.dep and /boot/vmlinuz-<k>)")
    if t.source == "dnf":
        there = ("an nvidia module is there" if _dnf_modules_present(ctx.root, pending)
                 else "none is there yet: its first boot builds or installs it")
        return Decision("next-kernel", f"{pending}: not prepared",
                        f"{DNF_REASON}; /lib/modules/{pending}/extra: {there}")
    if modules_ready(ctx.layout, t.version, pending, t.flavour):
        return Decision("next-kernel", f"{pending}: modules ready",
                        f"{_origin(ctx.layout, t.version, pending, t.flavour)} into "
                        f"{_host_build(ctx.layout, t.version, pending, t.flavour)}; booting "
                        f"{pending} loads them with no compile and no download")
    setting = ctx.config.next_kernel
    if setting == "off":
        return Decision("next-kernel", f"{pending}: not prepared",
                        "NVIDIA_INSTALLER_NEXT_KERNEL=off: its first boot builds the modules")
    if setting == "separate":
        return Decision("next-kernel", f"{pending}: not prepared yet",
                        "NVIDIA_INSTALLER_NEXT_KERNEL=separate: `installer prepare-next-kernel` "
                        "(the DaemonSet's long-running container) prepares it, not `run`")
    previous = read_attempt(ctx.layout)
    tried = ""
    if previous and previous.get("kernel") == pending and previous.get("state") == "failed":
        error = previous.get("error") or {}
        tried = (f"; the last attempt failed ({previous.get('at')}: "
                 f"error[{error.get('reference')}]) and is retried")
    how = ("pulled from the module registry when an artifact matches, else compiled"
           if ctx.config.module_registry else "compiled")
    when = ("after the driver is verified and ready" if t.load
            else "after the modules are installed")
    return Decision("next-kernel", f"{pending}: prepared after this install",
                    f"{when}, before the run ends: {how} "
                    f"against its headers ({_headers_note(ctx, pending)}); a failure only "
                    f"warns{tried}")


def _headers_note(ctx: Context, kernel: str) -> str:
    from installer import kernel as kernels
    from installer.headers import fetch

    found = kernels.find_headers(ctx.root, kernel)
    if found is not None:
        return f"on the host at {found.host_path}"
    if fetch.cached(ctx.layout, kernel) is not None:
        return f"fetched earlier into {ctx.layout.cache_host}/headers/{kernel}"
    if kernels.find_container_headers(kernel) is not None:
        return "in the image"
    if ctx.config.fetch_headers == "false":
        return "none found, and fetching is off"
    return "fetched from the host's package sources"


def _host_build(layout: Layout, version: str, kernel: str, flavour: str) -> PurePosixPath:
    return layout.cache_host / "modules" / version / kernel / flavour


def steps(ctx: Context) -> list[Step]:
    """`prepare-next-kernel` after the install is recorded (and verified, when loaded), when a
    newer kernel is installed and NVIDIA_INSTALLER_NEXT_KERNEL=run; a failure only warns."""
    t = ctx.target
    pending = _pending(ctx)
    if pending is None or ctx.config.next_kernel != "run" or t.source != "runfile":
        return []
    tried = [False]

    def satisfied() -> bool:
        return tried[0] or modules_ready(ctx.layout, t.version, pending, t.flavour)

    def apply() -> None:
        tried[0] = True
        prepare_guarded(ctx.config, ctx.runner, ctx.layout, pending, t.version, t.flavour)

    return [Step(STEP_NAME, f"modules for the installed kernel {pending} (the next "
                 "boot's) into the cache, after the driver is ready; a failure only warns",
                 satisfied, apply)]


def split_steps(steps: list[Step]) -> tuple[list[Step], list[Step]]:
    """The plan's steps before `prepare-next-kernel`, and it with those after it: what has to
    finish before the node is given back (the upgrade protocol's uncordon) and what need not."""
    names = [step.name for step in steps]
    at = names.index(STEP_NAME) if STEP_NAME in names else len(steps)
    return steps[:at], steps[at:]


# --- `installer status` and `installer prepare-next-kernel` ----------------------------------


def status(config: Config, root: HostRoot, layout: Layout,
           record: state.InstallRecord | None) -> dict[str, Any]:
    """The pending kernel and whether its modules are ready, for `installer status`."""
    current = host.kernel_release(root, config.kernel_release)
    pending = pending_kernel(root, current, host.kernel_release(root))
    report: dict[str, Any] = {"kernel": pending, "setting": config.next_kernel}
    if pending is None:
        return report
    if record is None:
        return {**report, "modules_ready": False, "why": "no driver installed yet"}
    if record.source == "dnf":
        return {**report, "modules_ready": _dnf_modules_present(root, pending),
                "modules": f"/lib/modules/{pending}/extra", "why": DNF_REASON}
    ready = modules_ready(layout, record.version, pending, record.flavour)
    report.update(modules_ready=ready,
                  modules=str(_host_build(layout, record.version, pending, record.flavour)))
    attempt = read_attempt(layout)
    if attempt and attempt.get("kernel") == pending and attempt.get("version") == record.version:
        report["last_attempt"] = attempt
    return report


def prepare_installed(config: Config, runner: Runner) -> str:
    """For the driver the install record names: modules for the pending kernel into the cache,
    under the host lock, then the extracted tree dropped again (as prune-cache does). Returns
    what happened, in words; raises the build's errors and LockTimeout."""
    from installer.steps import remove_tree

    root = HostRoot(config.root)
    layout = Layout.from_config(config, root)
    if config.next_kernel == "off":
        return "NVIDIA_INSTALLER_NEXT_KERNEL=off: nothing to do"
    record = state.read_record(layout.state_file)
    if record is None:
        return "no driver installed yet (no install record): nothing to prepare"
    current = host.kernel_release(root, config.kernel_release)
    pending = pending_kernel(root, current, host.kernel_release(root))
    if pending is None:
        return f"no kernel newer than {current} is installed"
    if record.source == "dnf":
        return f"next kernel {pending}: not prepared: {DNF_REASON}"
    with state.HostLock(layout.lock_file, config.lock_timeout):
        if modules_ready(layout, record.version, pending, record.flavour):
            return f"next kernel {pending}: modules ready"
        try:
            _prepare_recorded(config, runner, layout, pending, record.version, record.flavour)
        finally:
            remove_tree(layout.extracted(record.version))
    origin = _origin(layout, record.version, pending, record.flavour)
    return f"next kernel {pending}: modules ready ({origin})"


def watch(config: Config, runner: Runner, interval: float, *,
          sleep: Callable[[float], None] = time.sleep, rounds: int | None = None) -> None:
    """`prepare_installed` every `interval` seconds, for ever (a DaemonSet container): a
    kernel installed days after the pod started is prepared before the reboot into it.
    Failures are warnings; a kernel whose preparation failed is tried again after six
    intervals, a lock held by another installer at the next one. `rounds` bounds the loop."""
    from installer.errors import LockTimeout

    said = ""
    retry_at: dict[str, float] = {}
    done = 0
    while rounds is None or done < rounds:
        done += 1
        key = _watch_key(config)
        if retry_at.get(key, 0.0) <= time.monotonic():
            try:
                message = prepare_installed(config, runner)
            except LockTimeout as exc:
                message = f"waiting: {exc.message}"
            except InstallerError as exc:
                retry_at[key] = time.monotonic() + 6 * interval
                message = (f"error[{exc.reference}]: {exc.message}; tried again in "
                           f"{6 * interval:.0f} s")
            if message != said:
                log.info("%s", message)
                said = message
        if rounds is None or done < rounds:
            sleep(interval)


def _watch_key(config: Config) -> str:
    """What a failure is remembered by: the pending kernel and the installed driver."""
    root = HostRoot(config.root)
    layout = Layout.from_config(config, root)
    record = state.read_record(layout.state_file)
    current = host.kernel_release(root, config.kernel_release)
    pending = pending_kernel(root, current, host.kernel_release(root))
    return f"{pending} {record.version if record else None} {record.flavour if record else None}"
