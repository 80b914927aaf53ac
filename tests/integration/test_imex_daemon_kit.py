"""`installer imex` with real processes: the kit's stand-in nvidia-imex (from the kit's redist
archive, installed as the plan's install-imex step does) under the supervisor, run with the
config the installer writes; READY from the kit's nvidia-imex-ctl over the real unix socket,
in the readiness file, the node condition's facts and the metrics; restarted when it dies;
given up on (imex-failed) when the loaded driver is of another version; the stand-in itself
forks by default, as the host's unit (Type=forking) expects."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from lib.hosttrees import make_host, root_env, write_driver_version

from installer.cluster import condition
from installer.components import imex, imexd
from installer.components.supervisor import (
    Supervisor,
    read_restarts,
    ready_file,
)
from installer.config import Config, from_env
from installer.errors import ImexFailed
from installer.hostroot import HostRoot
from installer.layout import READY_FILE, Layout

V = "580.105.08"
W = "570.195.03"
GB200 = 0x2941


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A unix socket's path must fit in 108 bytes: pytest's tmp_path is too deep for it."""
    path = Path(tempfile.mkdtemp(prefix="imx", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def tray(base: Path, loaded: str, monkeypatch: pytest.MonkeyPatch
         ) -> tuple[HostRoot, Config, Layout]:
    """A GB200 tray: driver `loaded` verified, IMEX V installed from the kit's archive."""
    from kit.imex import build_imex

    top = base / "h"
    root = make_host(top, gpus=[GB200])
    write_driver_version(top, loaded, "open")
    root.write_atomic(READY_FILE, f"DRIVER_VERSION={loaded}\n")
    config = from_env(root_env(top, NVIDIA_INSTALL_DIR_HOST="/n",
                               NVIDIA_IMEX_NODES="10.0.0.1,10.0.0.2"))
    layout = Layout.from_config(config, root)
    archive = build_imex(V, base / "redist")
    imex.install(archive, base / "work", layout, V)
    if loaded != V:  # the loaded driver's own IMEX is the kit's of V, as a mirror may lag
        shutil.copytree(layout.version_dir(V), layout.version_dir(loaded))
        (layout.version_dir(loaded) / "bin" / imex.MARKER).write_text(
            (layout.version_dir(V) / "bin" / imex.MARKER).read_text().replace(V, loaded, 1))
    # The stand-ins read the loaded driver's version under the kit's test-only prefix.
    monkeypatch.setenv("NVFAKE_TEST_ROOT", str(top))
    return root, config, layout


def wait_for(check: object, timeout: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_installer_imex_answers_ready_on_its_socket_and_stops_cleanly(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from installer.metrics import exporter, snapshot

    def metrics() -> snapshot.Snapshot:
        return snapshot.take(config, root, layout, snapshot.CachedGpus(lambda: (), 60))

    root, config, layout = tray(short_tmp, V, monkeypatch)
    # No imex container has said anything on this node: no series (it is opt-in).
    assert "imex" not in metrics().daemons and "imex" not in metrics().restarts
    daemon = imexd.ImexDaemon(config, root)
    stop = threading.Event()
    errors: list[BaseException] = []
    supervisor = Supervisor(daemon, root, restarts=3, stop=stop, poll=0.05, backoff=0.05)

    def run() -> None:
        try:
            supervisor.run()
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    marker = root.local(ready_file("imex"))
    try:
        wait_for(marker.exists)
        sock = layout.install_local / "etc" / "nvidia-imex" / "imex_ctrl.sock"
        assert stat.S_ISSOCK(sock.stat().st_mode)
        values = dict(line.split("=", 1) for line in marker.read_text().splitlines())
        assert values["IMEX"] == "READY" and values["DRIVER_VERSION"] == V
        assert values["SOCKET"] == "/n/etc/nvidia-imex/imex_ctrl.sock"  # as the host sees it
        # What the DRA driver's kubelet plugin asks, over the real socket.
        ctl = layout.version_dir(V) / "bin" / "nvidia-imex-ctl"
        said = subprocess.run([str(ctl), "-q", f"--u={sock}"], capture_output=True,
                              text=True, timeout=30)
        assert (said.returncode, said.stdout) == (0, "READY\n")
        nodes = subprocess.run([str(ctl), "-N", f"--u={sock}"], capture_output=True,
                               text=True, timeout=30)
        assert nodes.stdout == "Nodes: 2\n"  # the two addresses of NVIDIA_IMEX_NODES
        # The condition reports it (the gate does not wait for it: fabricmanager and
        # persistenced are the components it waits for here).
        reading = condition.observe(root, ("fabricmanager", "persistenced"))
        assert "imex: up (READY)" in reading.message
        snap = metrics()
        assert snap.daemons["imex"]["IMEX"] == "READY"
        up = {tuple(s.labels.values()): s.value for family in exporter.families(snap)
              if family.name.endswith("_daemon_up") for s in family.samples}
        assert snap.driver_ready and up[("imex", "running")] == 1.0
        # The daemon dies: restarted, counted, READY again.
        pid = int(values["PID"])
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: read_restarts(root, "imex") == 1)
        wait_for(lambda: marker.exists() and f"PID={pid}\n" not in marker.read_text())
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive() and errors == []
    # SIGTERM: the stand-in removes its socket; the readiness file goes with the container.
    assert not marker.exists()
    assert not (layout.install_local / "etc" / "nvidia-imex" / "imex_ctrl.sock").exists()


def test_imex_of_another_version_than_the_loaded_driver_is_given_up_on(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit's nvidia-imex aborts on a driver it is not of, as the real one does: the
    container exits with imex-failed and the daemon's own words."""
    root, config, _layout = tray(short_tmp, W, monkeypatch)
    daemon = imexd.ImexDaemon(config, root)
    with pytest.raises(ImexFailed) as info:
        Supervisor(daemon, root, restarts=1, poll=0.02, backoff=0.05).run()
    message = info.value.message
    assert message.startswith("imex exited 2 times within 10 minutes (last exit status 1)")
    assert message.splitlines()[-1] == (f"IMEX: driver version {W} is not compatible with "
                                        f"IMEX {V}")
    assert info.value.reference == "imex-failed" and info.value.exit_code == 93
    assert not root.local(ready_file("imex")).exists()


def test_the_kits_ctl_says_nothing_is_ready_where_nothing_listens(short_tmp: Path) -> None:
    from kit.imex import build_imex

    archive = build_imex(V, short_tmp / "redist")
    subprocess.run(["tar", "-xJf", str(archive), "-C", str(short_tmp)], check=True)
    ctl = next(short_tmp.glob("nvidia-imex-*/bin/nvidia-imex-ctl"))
    dead = short_tmp / "dead.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(dead))
    listener.close()  # a socket file nobody serves
    said = subprocess.run([str(ctl), "-q", f"--u={dead}"], capture_output=True, text=True)
    assert said.returncode == 1 and "READY" not in said.stdout
    assert f"cannot connect to the IMEX daemon at {dead}" in said.stderr


def test_the_kits_nvidia_imex_forks_by_default_as_the_units_type_forking_expects(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _root, _config, layout = tray(short_tmp, V, monkeypatch)
    (short_tmp / "nodes.cfg").write_text("10.0.0.1\n")
    sock = short_tmp / "ctl.sock"
    cfg = short_tmp / "daemonized.cfg"
    cfg.write_text(f"IMEX_NODE_CONFIG_FILE={short_tmp / 'nodes.cfg'}\nIMEX_CMD_ENABLED=1\n"
                   f"IMEX_CMD_UNIX_DOMAIN_PATH={sock}\n")
    binary = layout.version_dir(V) / "bin" / "nvidia-imex"
    parent = subprocess.run([str(binary), "-c", str(cfg)], capture_output=True, text=True,
                            timeout=30)
    # The daemon is the process left running with this config (found first, so a failing
    # assertion below still stops it).
    children = []
    for entry in Path("/proc").iterdir():
        try:
            if str(cfg).encode() in (entry / "cmdline").read_bytes():
                children.append(int(entry.name))
        except (OSError, ValueError):
            continue
    try:
        assert parent.returncode == 0  # the parent returns; the daemon goes on
        assert len(children) == 1
        wait_for(sock.exists)
        ctl = layout.version_dir(V) / "bin" / "nvidia-imex-ctl"
        said = subprocess.run([str(ctl), "-q", "-u", str(sock)], capture_output=True,
                              text=True, timeout=30)
        assert said.stdout == "READY\n"
    finally:
        for child in children:
            os.kill(child, signal.SIGTERM)
    wait_for(lambda: not sock.exists())
