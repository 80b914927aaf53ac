"""`installer imex` (components/imexd.py) on posed hosts: the node list it takes (never
guessed), the config it writes, where it idles, the host's own running nvidia-imex.service it
refuses to start beside, channel 0 by nvidia-modprobe, READY from nvidia-imex-ctl -q."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lib.contexts import V, our_process
from lib.fakes import FakeRunner
from lib.hosttrees import H100, add_process, make_host, root_env, write_driver_version

from installer.components import imex, imexd
from installer.components.supervisor import Driver, Idle
from installer.config import from_env
from installer.errors import (
    DeviceNodesFailed,
    ImexHostServiceRunning,
    ImexMissing,
    ImexNodesInvalid,
)
from installer.hostroot import HostRoot
from installer.layout import Layout

GB200 = 0x2941
DRIVER = Driver(V, Path("/var/lib/nvidia"))  # type: ignore[arg-type]


def tray(tmp_path: Path, **env: str) -> tuple[imexd.ImexDaemon, HostRoot, Layout]:
    """A GB200 tray with IMEX of V installed (its marker and binaries) and the driver V."""
    root = make_host(tmp_path, gpus=[GB200])
    write_driver_version(tmp_path, V, "open")
    config = from_env(root_env(tmp_path, **env))
    layout = Layout.from_config(config, root)
    bin_dir = layout.version_dir(V) / "bin"
    bin_dir.mkdir(parents=True)
    for name in imex.BINARIES:
        (bin_dir / name).write_text("#!/bin/sh\n")
    (bin_dir / imex.MARKER).write_text(f"{V}\n{'0' * 64}\n")
    daemon = imexd.ImexDaemon(config, root)
    daemon.commands = FakeRunner()
    return daemon, root, layout


def test_the_node_list_is_a_setting_or_a_mounted_file_and_never_guessed(tmp_path: Path) -> None:
    def nodes(value: str) -> list[str]:
        return imexd.nodes(from_env(root_env(tmp_path, NVIDIA_IMEX_NODES=value)),
                           HostRoot(tmp_path))

    assert nodes("10.0.0.1, 10.0.0.2,fd00::3") == ["10.0.0.1", "10.0.0.2", "fd00::3"]
    listed = tmp_path / "configmap" / "nodes_config.cfg"
    listed.parent.mkdir()
    listed.write_text("# rack 7\n10.0.0.1\n\n10.0.0.2  # tray 2\n")
    assert nodes(str(listed)) == ["10.0.0.1", "10.0.0.2"]
    for value, said in [
        ("", "NVIDIA_IMEX_NODES is not set"),
        ("10.0.0.1,tray-2", "'tray-2' is not an IP address"),
        ("10.0.0.1,10.0.0.1", "lists an address twice"),
        (" , ", "lists no address"),
        (str(tmp_path / "absent.cfg"), "cannot read it"),
    ]:
        with pytest.raises(ImexNodesInvalid) as info:
            nodes(value)
        assert said in info.value.message
        assert info.value.reference == "imex-nodes-invalid" and info.value.exit_code == 109


def test_the_config_keeps_it_in_the_foreground_with_its_command_socket_on() -> None:
    text = imexd.config_text(Path("/usr/local/nvidia/etc/nvidia-imex/imex_ctrl.sock"),
                             Path("/usr/local/nvidia/etc/nvidia-imex/nodes_config.cfg"))
    assert text == (
        "DAEMONIZE=0\n"
        "IMEX_NODE_CONFIG_FILE=/usr/local/nvidia/etc/nvidia-imex/nodes_config.cfg\n"
        "IMEX_CMD_ENABLED=1\n"
        "IMEX_CMD_PORT=50005\n"
        "IMEX_CMD_UNIX_DOMAIN_PATH=/usr/local/nvidia/etc/nvidia-imex/imex_ctrl.sock\n")
    assert imexd.argv(Path("/d/nvidia-imex"), Path("/c/config.cfg")) == [
        "/d/nvidia-imex", "-c", "/c/config.cfg"]
    assert imexd.query_argv(Path("/d/nvidia-imex-ctl"), Path("/s.sock")) == [
        "/d/nvidia-imex-ctl", "-q", "--u=/s.sock"]


def test_it_writes_its_config_in_the_driver_root_and_starts_nothing_yet(tmp_path: Path) -> None:
    daemon, _root, layout = tray(tmp_path, NVIDIA_IMEX_NODES="10.0.0.1,10.0.0.2")
    start = daemon.plan(DRIVER)
    assert callable(start) and not isinstance(start, Idle)
    etc = layout.install_local / "etc" / "nvidia-imex"
    assert (etc / "nodes_config.cfg").read_text() == "10.0.0.1\n10.0.0.2\n"
    assert (etc / "config.cfg").read_text() == imexd.config_text(
        etc / "imex_ctrl.sock", etc / "nodes_config.cfg")
    assert daemon.commands.calls == []  # type: ignore[attr-defined]  # channels: the DRA driver's


def test_another_socket_path_follows_the_dra_drivers_host_socket_path(tmp_path: Path) -> None:
    daemon, _root, layout = tray(tmp_path, NVIDIA_IMEX_NODES="10.0.0.1",
                                 NVIDIA_IMEX_SOCKET="/run/imex/ctl.sock")
    daemon.plan(DRIVER)
    assert daemon.socket_path == layout.install_local / "run" / "imex" / "ctl.sock"
    assert daemon.socket_path.parent.is_dir()
    assert (f"IMEX_CMD_UNIX_DOMAIN_PATH={daemon.socket_path}\n"
            in (layout.install_local / "etc/nvidia-imex/config.cfg").read_text())


def test_a_bad_node_list_stops_it_before_any_file_is_written(tmp_path: Path) -> None:
    daemon, _root, layout = tray(tmp_path, NVIDIA_IMEX_NODES="10.0.0.1,rack7")
    with pytest.raises(ImexNodesInvalid):
        daemon.plan(DRIVER)
    assert not (layout.install_local / "etc").exists()


def test_it_idles_where_imex_is_not_installed(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[H100])
    daemon = imexd.ImexDaemon(from_env(root_env(tmp_path)), root)
    said = daemon.plan(DRIVER)
    assert isinstance(said, Idle)
    assert said.reason.startswith("no GB200/GB300 GPU")
    daemon = imexd.ImexDaemon(from_env(root_env(tmp_path, NVIDIA_IMEX="false")), root)
    assert daemon.plan(DRIVER) == Idle("NVIDIA_IMEX=false")


def test_it_refuses_to_start_beside_the_hosts_running_nvidia_imex(tmp_path: Path) -> None:
    daemon, _root, layout = tray(tmp_path, NVIDIA_IMEX_NODES="10.0.0.1")
    unit = tmp_path / "usr/lib/systemd/system/nvidia-imex.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg\n")
    proc = add_process(tmp_path, 812, "nvidia-imex", {}, cmdline="/usr/bin/nvidia-imex")
    os.symlink("/usr/bin/nvidia-imex", proc / "exe")
    with pytest.raises(ImexHostServiceRunning) as info:
        daemon.plan(DRIVER)
    assert info.value.message.startswith(
        "the host's nvidia-imex.service (/usr/lib/systemd/system/nvidia-imex.service) runs: "
        "pid 812 (/usr/bin/nvidia-imex)")
    assert "systemctl mask nvidia-imex" in info.value.hint
    assert info.value.exit_code == 94
    assert not (layout.install_local / "etc").exists()  # nothing written


def test_systemds_invocation_of_the_unit_counts_as_running(tmp_path: Path) -> None:
    daemon, root, _layout = tray(tmp_path, NVIDIA_IMEX_NODES="10.0.0.1")
    link = root.local(imexd.INVOCATION)
    link.parent.mkdir(parents=True)
    os.symlink("9f2c0d5e0a7d4c1b8e3f", link)
    with pytest.raises(ImexHostServiceRunning) as info:
        daemon.plan(DRIVER)
    assert info.value.message.startswith(f"the host's nvidia-imex.service runs (systemd: "
                                         f"{imexd.INVOCATION})")


def test_our_own_nvidia_imex_is_not_the_hosts(tmp_path: Path) -> None:
    daemon, _root, layout = tray(tmp_path, NVIDIA_IMEX_NODES="10.0.0.1")
    our_process(tmp_path, 900, str(layout.install_host), "nvidia-imex")
    assert imexd.host_service(daemon.root, layout, daemon.config) is None
    assert callable(daemon.plan(DRIVER))


def test_imex_of_the_loaded_driver_must_be_installed(tmp_path: Path) -> None:
    daemon, _root, layout = tray(tmp_path, NVIDIA_IMEX_NODES="10.0.0.1")
    (layout.version_dir(V) / "bin" / imex.MARKER).unlink()
    with pytest.raises(ImexMissing) as info:
        daemon.plan(DRIVER)
    assert f"IMEX {V}, the loaded driver's version" in info.value.message
    assert info.value.exit_code == 29


def test_channel0_is_made_by_nvidia_modprobe_where_no_dra_driver_makes_it(
        tmp_path: Path) -> None:
    daemon, root, layout = tray(tmp_path, NVIDIA_IMEX_NODES="10.0.0.1",
                                NVIDIA_IMEX_CHANNELS="channel0")
    runner = FakeRunner().on(str(layout.version_dir(V) / "bin" / "nvidia-modprobe"))
    daemon.commands = runner
    daemon.plan(DRIVER)
    assert [c.argv for c in runner.calls] == [
        [str(layout.version_dir(V) / "bin" / "nvidia-modprobe"), "-i", "0:1"]]
    # Present already (NVreg_CreateImexChannel0=1, or an earlier start): not made again.
    root.local(imex.CHANNEL0).parent.mkdir(parents=True)
    root.local(imex.CHANNEL0).write_text("")
    daemon.plan(DRIVER)
    assert len(runner.calls) == 1


def test_a_failed_channel0_stops_it_before_the_daemon_starts(tmp_path: Path) -> None:
    daemon, _root, layout = tray(tmp_path, NVIDIA_IMEX_NODES="10.0.0.1",
                                 NVIDIA_IMEX_CHANNELS="channel0")
    daemon.commands = FakeRunner().on(str(layout.version_dir(V) / "bin" / "nvidia-modprobe"),
                                      returncode=1, output="no nvidia-caps-imex-channels")
    with pytest.raises(DeviceNodesFailed) as info:
        daemon.plan(DRIVER)
    assert "IMEX channel 0" in info.value.message
    assert not (layout.install_local / "etc" / "nvidia-imex" / "config.cfg").exists()


def test_ready_is_what_nvidia_imex_ctl_says_over_the_socket(tmp_path: Path) -> None:
    daemon, _root, layout = tray(tmp_path, NVIDIA_IMEX_NODES="10.0.0.1")
    daemon.plan(DRIVER)
    ctl = str(layout.version_dir(V) / "bin" / "nvidia-imex-ctl")
    daemon.commands = FakeRunner().on(ctl, output="UNAVAILABLE\n")
    assert daemon.ready(object()) is None  # type: ignore[arg-type]
    daemon.commands = FakeRunner().on(ctl, returncode=1, output="cannot connect\n")
    assert daemon.ready(object()) is None  # type: ignore[arg-type]
    runner = FakeRunner().on(ctl, output="READY\n")
    daemon.commands = runner
    assert daemon.ready(object()) == (  # type: ignore[arg-type]
        f"DRIVER_VERSION={V}\nSTATE=running\nPID=0\nIMEX=READY\n"
        f"SOCKET={layout.install_host}/etc/nvidia-imex/imex_ctrl.sock\n")
    assert runner.calls[0].argv == [ctl, "-q", f"--u={daemon.socket_path}"]
