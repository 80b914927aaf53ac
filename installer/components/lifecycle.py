"""Our daemons around an unload: which holders of the driver are ours, and pausing them."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath

from installer import host, kmod
from installer.components import registry
from installer.config import Config
from installer.host import Holder
from installer.hostroot import HostRoot
from installer.layout import Layout

log = logging.getLogger(__name__)


def _install_dirs(layout: Layout, config: Config) -> tuple[PurePosixPath, ...]:
    """The install dir as the host, this process and the DaemonSet's containers see it."""
    dirs = {layout.install_host, PurePosixPath(str(layout.install_local)),
            PurePosixPath(str(config.install_dir_container))}
    return tuple(sorted(dirs))


def our_daemons(root: HostRoot, layout: Layout, config: Config) -> set[int]:
    """Pids of the daemons we run from the install dir (they hold /dev/nvidia*)."""
    from installer.components import processes

    return {d.pid for d in processes.find(root, registry.daemons(), _install_dirs(layout, config))}


def not_ours(root: HostRoot, layout: Layout, config: Config,
             holders: list[Holder]) -> list[Holder]:
    """`holders` less our own daemons, which `pause` stops right before an unload."""
    if not holders:
        return holders
    ours = our_daemons(root, layout, config)
    return [h for h in holders if h.pid not in ours]


def holders(root: HostRoot, layout: Layout, config: Config) -> list[str]:
    """The processes other than our daemons that hold /dev/nvidia*, a phrase each."""
    return [f"pid {h.pid} ({h.command}) holds {h.path}"
            for h in not_ours(root, layout, config, host.holders_of(root, "/dev/nvidia"))]


def driver_held(root: HostRoot, layout: Layout, config: Config) -> bool:
    """Whether an unload would be refused for a reason other than our own daemons (which
    `pause` stops right before it): another holder of /dev/nvidia*, or a module in use while
    none of its holders is ours."""
    everyone = host.holders_of(root, "/dev/nvidia")
    others = not_ours(root, layout, config, everyone)
    busy = any(count > 0 for name, count in kmod.loaded_modules(root).items()
               if name in kmod.UNLOAD_ORDER)
    # When our daemons are the only processes holding the driver, the module references are
    # theirs; the unload checks again once they are stopped.
    return bool(others or (busy and len(others) == len(everyone)))


def pause(root: HostRoot, layout: Layout, config: Config) -> None:
    """Before the driver is freed for an unload: the pause file tells `installer
    fabricmanager` and `installer persistenced` to stop their daemons and not restart them
    while this installer holds the host lock; our daemons get SIGTERM here too and are waited
    for. A daemon this process cannot signal (another PID namespace) is left: the unload then
    names it as a holder. The pause ends with `resume`, or with this process (a pause file
    whose installer released the lock is stale)."""
    from installer.components import processes
    from installer.components.supervisor import PAUSE_FILE, ready_file

    root.write_atomic(PAUSE_FILE, f"INSTALLER_PID={os.getpid()}\n")
    daemons = processes.find(root, registry.daemons(), _install_dirs(layout, config))
    if daemons:
        # In registry order: Fabric Manager before NVLSM, as NVIDIA's driver container
        # unloads (then the modules).
        for daemon in processes.terminate_in_order(root, daemons, registry.daemons()):
            log.warning("cannot stop %s (pid %d) from here", daemon.name, daemon.pid)
    # Their containers are not ready while the daemons are stopped.
    for name in registry.commands():
        root.local(ready_file(name)).unlink(missing_ok=True)


def resume(root: HostRoot) -> None:
    from installer.components.supervisor import PAUSE_FILE

    path = root.local(PAUSE_FILE)
    if path.exists():
        path.unlink()


@contextlib.contextmanager
def paused(root: HostRoot, layout: Layout, config: Config, *, when: bool = True
           ) -> Iterator[None]:
    """Our daemons stopped (and kept stopped) for the duration; nothing unless `when` (an
    unload that will be refused for other holders leaves them running)."""
    if when:
        pause(root, layout, config)
    try:
        yield
    finally:
        if when:
            resume(root)


def pause_for(root: HostRoot, layout: Layout, config: Config,
              make_room: Callable[[], None]) -> None:
    """Our daemons stopped before the upgrade protocol's `make_room`, which waits for every
    holder of the driver to go, ours included. They stay stopped until the unload, or until
    this run ends (its host lock released); `make_room` failing resumes them."""
    pause(root, layout, config)
    try:
        make_room()
    except BaseException:
        resume(root)
        raise
