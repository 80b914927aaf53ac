"""`installer status`'s view of the next kernel and `installer prepare-next-kernel [--watch]`,
which the DaemonSet's long-running container runs."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from installer import host, state
from installer.config import Config
from installer.errors import InstallerError
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.nextkernel.cache import (
    BuildModules,
    modules_ready,
    origin,
    prepare_recorded,
    read_attempt,
)
from installer.nextkernel.detect import pending_kernel
from installer.nextkernel.planning import host_build
from installer.runner import Runner

log = logging.getLogger(__name__)


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
    from installer import sources

    elsewhere = sources.recorded(record.source).next_kernel_elsewhere(root, pending)
    if elsewhere is not None:
        return {**report, "modules_ready": elsewhere.present, "modules": elsewhere.where,
                "why": elsewhere.why}
    ready = modules_ready(layout, record.version, pending, record.flavour)
    report.update(modules_ready=ready,
                  modules=str(host_build(layout, record.version, pending, record.flavour)))
    attempt = read_attempt(layout)
    if attempt and attempt.get("kernel") == pending and attempt.get("version") == record.version:
        report["last_attempt"] = attempt
    return report


def prepare_installed(config: Config, runner: Runner, build: BuildModules) -> str:
    """For the driver the install record names: modules for the pending kernel into the cache,
    under the host lock, then the extracted tree dropped again (as prune-cache does). Returns
    what happened, in words; raises the build's errors and LockTimeout."""
    from installer.dirs import remove_tree

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
    from installer import sources

    elsewhere = sources.recorded(record.source).next_kernel_elsewhere(root, pending)
    if elsewhere is not None:
        return f"next kernel {pending}: not prepared: {elsewhere.why}"
    with state.HostLock(layout.lock_file, config.lock_timeout):
        if modules_ready(layout, record.version, pending, record.flavour):
            return f"next kernel {pending}: modules ready"
        try:
            prepare_recorded(config, runner, layout, pending, record.version, record.flavour,
                             build)
        finally:
            remove_tree(layout.extracted(record.version))
    where = origin(layout, record.version, pending, record.flavour)
    return f"next kernel {pending}: modules ready ({where})"


def watch(config: Config, runner: Runner, build: BuildModules, interval: float, *,
          sleep: Callable[[float], None] = time.sleep, rounds: int | None = None) -> None:
    """`prepare_installed` every `interval` seconds, for ever (a DaemonSet container): a
    kernel installed days after the pod started is prepared before the reboot into it.
    Failures are logged, never the end of the loop (an unforeseen one with its traceback at
    debug level); a kernel whose preparation failed is tried again after six intervals, a lock
    held by another installer at the next one. `rounds` bounds the loop."""
    from installer.errors import LockTimeout

    said = ""
    retry_at: dict[str, float] = {}
    done = 0
    while rounds is None or done < rounds:
        done += 1
        key = _watch_key(config)
        if retry_at.get(key, 0.0) <= time.monotonic():
            try:
                message = prepare_installed(config, runner, build)
            except LockTimeout as exc:
                message = f"waiting: {exc.message}"
            except InstallerError as exc:
                retry_at[key] = time.monotonic() + 6 * interval
                message = (f"error[{exc.reference}]: {exc.message}; tried again in "
                           f"{6 * interval:.0f} s")
            except Exception as exc:  # a container that dies starts over: keep watching
                log.debug("preparing the next kernel failed", exc_info=True)
                retry_at[key] = time.monotonic() + 6 * interval
                message = (f"unexpected {type(exc).__name__}: {exc}; tried again in "
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
