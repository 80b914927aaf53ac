"""The supervisor behind `installer fabricmanager` / `installer persistenced` with real child
processes: restart with backoff, give up with an error, stop cleanly, follow the readiness
file and an installer's pause; the kit's stand-in nv-fabricmanager run as the real config
makes it run; our daemons found in /proc and stopped with SIGTERM (SIGKILL when ignored)."""

from __future__ import annotations

import fcntl
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import NamedTuple, Union

import pytest
from lib.hosttrees import CLASS_BRIDGE, H100, add_pci_device, make_host, write_driver_version

from installer import runner
from installer.components import fm_archive, processes
from installer.components.fabricmanager_daemon import FabricManagerDaemon
from installer.components.supervisor import (
    PAUSE_FILE,
    Driver,
    Idle,
    Running,
    Supervisor,
    read_restarts,
    ready_file,
    restarts_file,
)
from installer.config import from_env
from installer.errors import FabricManagerFailed, InstallerError
from installer.hostroot import HostRoot
from installer.layout import READY_FILE, Layout

V = "580.105.08"
READY_TEXT = f"DRIVER_VERSION={V}\nKERNEL_MODULE_TYPE=open\nKERNEL_RELEASE=6.1.0\n" \
             "INSTALL_DIR=/home/kubernetes/bin/nvidia\n"


class ScriptDaemon:
    """A daemon that is a Python one-liner; it says "up" when it does its job."""

    name = "fakedaemon"

    def __init__(self, script: str, idle: str | None = None) -> None:
        self.script = script
        self.idle = idle
        self.starts: list[float] = []
        self.up = False
        self.lines: list[str] = []

    def plan(self, driver: Driver) -> Union[Idle, Callable[[], Running]]:
        if self.idle:
            return Idle(self.idle)

        def start() -> Running:
            self.starts.append(time.monotonic())
            self.up = False
            return runner.spawn([sys.executable, "-u", "-c", self.script], on_line=self._line)

        return start

    def _line(self, line: str) -> None:
        self.lines.append(line)
        if line == "up":
            self.up = True

    def ready(self, running: Running) -> str | None:
        return "STATE=running\n" if self.up else None

    def failed(self, message: str) -> InstallerError:
        return FabricManagerFailed(message)


def host(tmp_path: Path) -> HostRoot:
    root = make_host(tmp_path / "host", gpus=[H100])
    write_driver_version(tmp_path / "host", V)
    root.write_atomic(READY_FILE, READY_TEXT)
    return root


STARTED: list[InThread] = []


class InThread:
    """A supervisor running in a thread, as the container's main loop."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        STARTED.append(self)

    def _run(self) -> None:
        try:
            self.supervisor.run()
        except BaseException as exc:  # handed to the test
            self.error = exc

    def stop(self) -> None:
        self.supervisor.stop.set()
        self.thread.join(20)
        assert not self.thread.is_alive()


@pytest.fixture(autouse=True)
def no_supervisor_left() -> Iterator[None]:
    """A failed test still stops its supervisor (and so its daemon)."""
    yield
    while STARTED:
        STARTED.pop().stop()


def eventually(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


SERVE = """
import signal, sys, time
def bye(*a):
    open(sys.argv[0] if False else {done!r}, "a").write("sigterm\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("up")
while True:
    time.sleep(0.1)
"""


class Serving(NamedTuple):
    root: HostRoot
    done: Path  # written by SERVE's SIGTERM handler
    daemon: ScriptDaemon
    running: InThread
    marker: Path  # the daemon's ready file


def serving(tmp_path: Path, **supervisor: object) -> Serving:
    """SERVE under a Supervisor (no restarts) on a host with a verified driver, once it is
    marked ready (up, its SIGTERM handler set)."""
    root = host(tmp_path)
    done = tmp_path / "done"
    daemon = ScriptDaemon(SERVE.format(done=str(done)))
    running = InThread(Supervisor(daemon, root, restarts=0, poll=0.02, **supervisor))
    marker = root.local(ready_file("fakedaemon"))
    eventually(marker.exists)
    return Serving(root, done, daemon, running, marker)


def test_a_dying_daemon_is_restarted_with_backoff_then_given_up(tmp_path: Path) -> None:
    root = host(tmp_path)
    daemon = ScriptDaemon("import sys; print('boom'); sys.exit(3)")
    supervisor = Supervisor(daemon, root, restarts=2, poll=0.02, backoff=0.2)
    started = time.monotonic()
    with pytest.raises(FabricManagerFailed) as info:
        supervisor.run()
    assert len(daemon.starts) == 3
    assert info.value.message == ("fakedaemon exited 3 times within 10 minutes (last exit "
                                  "status 3); not restarting it again")
    gaps = [b - a for a, b in zip(daemon.starts, daemon.starts[1:])]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps  # 0.2 s, then doubled
    assert time.monotonic() - started < 10
    assert not root.local(ready_file("fakedaemon")).exists()
    # Each death counted where the metrics container reads it (and a new container adds on).
    assert read_restarts(root, "fakedaemon") == 3
    with pytest.raises(FabricManagerFailed):
        Supervisor(daemon, root, restarts=0, poll=0.02).run()
    assert root.local(restarts_file("fakedaemon")).read_text() == "4\n"


def test_a_running_daemon_is_marked_ready_and_stopped_with_sigterm(tmp_path: Path) -> None:
    _, done, daemon, running, marker = serving(tmp_path)
    assert marker.read_text() == "STATE=running\n"
    running.stop()
    assert running.error is None
    assert done.read_text() == "sigterm\n"  # its handler ran: stopped, not killed
    assert not marker.exists() and len(daemon.starts) == 1


def test_the_daemon_follows_the_verified_driver_without_counting_failures(
        tmp_path: Path) -> None:
    root, done, daemon, running, marker = serving(tmp_path)
    root.local(READY_FILE).unlink()  # an installer replaces the driver
    eventually(lambda: done.exists() and not marker.exists())
    time.sleep(0.3)
    assert len(daemon.starts) == 1  # waits for the driver instead of restarting
    root.write_atomic(READY_FILE, READY_TEXT)
    eventually(lambda: len(daemon.starts) == 2 and marker.exists())
    running.stop()
    assert running.error is None  # restarts=0: a counted failure would have raised


def test_an_installers_pause_holds_while_it_has_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "installer.lock"
    root, done, daemon, running, _ = serving(tmp_path, lock_file=lock)
    with open(lock, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        root.write_atomic(PAUSE_FILE, "INSTALLER_PID=1\n")
        eventually(done.exists)
        time.sleep(0.3)
        assert len(daemon.starts) == 1
    # The installer ended without resuming (killed): its pause is stale, the daemon comes back.
    eventually(lambda: len(daemon.starts) == 2)
    assert not root.local(PAUSE_FILE).exists()
    running.stop()
    assert running.error is None


def test_where_it_does_not_apply_it_idles_and_says_so(tmp_path: Path) -> None:
    root = host(tmp_path)
    daemon = ScriptDaemon("", idle="no NVSwitch on this node")
    running = InThread(Supervisor(daemon, root, restarts=0, poll=0.02))
    marker = root.local(ready_file("fakedaemon"))
    eventually(marker.exists)
    assert marker.read_text() == (f"DRIVER_VERSION={V}\nSTATE=not-applicable\n"
                                  "REASON=no NVSwitch on this node\n")
    time.sleep(0.3)
    assert running.thread.is_alive() and not daemon.starts  # never exits on its own
    running.stop()
    assert running.error is None and not marker.exists()


def test_the_kits_fabric_manager_runs_in_the_foreground_and_is_given_up_on(
        tmp_path: Path) -> None:
    """The stand-in, as the rendered config runs it: in the foreground (DAEMONIZE=0) with its
    log on stderr; on this machine no driver is loaded, so it exits 1 each time."""
    from kit.fabricmanager import build_fabricmanager

    root = host(tmp_path)
    add_pci_device(tmp_path / "host", "0000:05:00.0", device=0x22A3, klass=CLASS_BRIDGE)
    config = from_env({"ROOT_MOUNT_DIR": str(tmp_path / "host"),
                       "NVIDIA_INSTALL_DIR_CONTAINER": str(tmp_path / "no-container-mount")})
    layout = Layout.from_config(config, root)
    archive = build_fabricmanager(V, tmp_path / "redist")
    tree = fm_archive.unpack(archive, tmp_path / "unpacked")
    (layout.version_dir(V) / "bin").mkdir(parents=True)
    fm_archive.install(tree, layout.version_dir(V), fm_archive.config_dir(layout, V), V)
    daemon = FabricManagerDaemon(config, root, env={"NVFM_CONFIG_LOG_LEVEL": "4"})
    try:
        with pytest.raises(FabricManagerFailed) as info:
            Supervisor(daemon, root, restarts=1, poll=0.02, backoff=0.05).run()
    finally:
        daemon.close()
    message = info.value.message
    assert message.startswith("fabricmanager exited 2 times within 10 minutes (last exit "
                              "status 1)")
    last = message.splitlines()[-1]  # the error it exited with ends the message
    assert "[ERROR]" in last and last.endswith(
        "request to query NVIDIA GPU driver information failed: the NVIDIA driver is not loaded")
    said = list(daemon.tail)
    # LOG_FILE_NAME emptied: its log is on stderr, which the supervisor passes on.
    assert any(line.endswith("Logging file name/path = ") for line in said)
    assert any(line.endswith(f"Topology file path = {fm_archive.config_dir(layout, V)}")
               for line in said)


def our_script(install: Path, name: str, body: str) -> Path:
    path = install / "versions" / V / "bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return path


def test_our_daemons_are_found_and_stopped_before_an_unload(tmp_path: Path) -> None:
    install = tmp_path / "install"
    polite = our_script(install, "nvidia-persistenced", SERVE.format(done=str(tmp_path / "d")))
    stubborn = our_script(install, "nv-fabricmanager", "import signal, time\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up')\n"
                          "while True: time.sleep(0.1)\n")
    said: list[str] = []
    children = [runner.spawn([str(polite)], on_line=said.append),
                runner.spawn([str(stubborn)], on_line=said.append)]
    elsewhere = shutil.copy(polite, tmp_path / "nvidia-persistenced")  # not in the install dir
    other = runner.spawn([str(elsewhere)], on_line=said.append)
    try:
        eventually(lambda: said.count("up") == 3)  # their SIGTERM handlers are set
        root = HostRoot(Path("/"))
        found = processes.find(root, ("nvidia-persistenced", "nv-fabricmanager"),
                               (PurePosixPath(str(install)),))
        assert sorted(d.pid for d in found) == sorted(c.pid for c in children)
        left = processes.terminate(root, found, timeout=1.0)
        assert left == []
        assert children[0].wait(5) == 0  # SIGTERM: its handler ran
        assert children[1].wait(5) == -9  # ignored SIGTERM: killed after the timeout
        assert (tmp_path / "d").read_text() == "sigterm\n"
        assert other.poll() is None  # a daemon outside the install dir is left alone
    finally:
        for child in [*children, other]:
            child.send_signal(9)
            child.wait(5)
