"""Where the upgrade protocol meets the unload step: off, today's driver-in-use with
no cluster code imported; on, room is made first and the holders are then gone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from lib.contexts import NEW, OLD, held_host
from lib.fakes import FakeRunner

from installer import host, steps
from installer.config import build_config
from installer.errors import (
    ClusterApiUnavailable,
    ConfigError,
    DriverHoldersTimeout,
    DriverInUse,
)
from installer.layout import READY_FILE
from installer.plan import Context


def test_protocol_off_keeps_driver_in_use(tmp_path: Path) -> None:
    ctx = held_host(tmp_path)
    with pytest.raises(DriverInUse, match=r"pid 4242 \(nvidia-device-p\) holds /dev/nvidia0"):
        steps.unload_old_step(ctx).apply()
    assert ctx.root.local(READY_FILE).exists()


def test_protocol_on_makes_room_then_unloads(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from installer.cluster import protocol

    ctx = held_host(tmp_path, NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true", NODE_NAME="gpu-1")
    calls = []

    def make_room(config: object, root: object, layout: object, old: str, new: str) -> None:
        calls.append((old, new, ctx.root.local(READY_FILE).exists()))
        shutil.rmtree(tmp_path / "proc" / "4242")  # the paused plugin went away

    monkeypatch.setattr(protocol, "make_room", make_room)
    steps.unload_old_step(ctx).apply()
    assert calls == [(OLD, NEW, True)]  # readiness kept until the holders are gone
    assert not ctx.root.local(READY_FILE).exists()
    assert [list(c.argv) for c in ctx.runner.calls] == [["rmmod", "nvidia_uvm"],
                                                         ["rmmod", "nvidia"]]


def test_protocol_needs_the_node_name() -> None:
    with pytest.raises(ConfigError, match="needs NODE_NAME"):
        build_config({"NVIDIA_INSTALLER_UPGRADE_PROTOCOL": "true"}, {})
    with pytest.raises(ConfigError, match="not a Kubernetes node name"):
        build_config({"NODE_NAME": "Bad_Name"}, {})
    with pytest.raises(ConfigError, match="not a component name"):
        build_config({"NVIDIA_INSTALLER_PAUSE_COMPONENTS": "device-plugin,Bad/x"}, {})
    config = build_config({"NVIDIA_INSTALLER_PAUSE_COMPONENTS": "device-plugin, dcgm",
                           "NODE_NAME": "ip-10-0-0-1.ec2.internal"}, {"upgrade_protocol": True})
    assert config.pause_components == ("device-plugin", "dcgm")
    assert config.upgrade_protocol and config.node_name == "ip-10-0-0-1.ec2.internal"



def _dead_api(tmp_path: Path) -> Path:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        '{"apiVersion": "v1", "kind": "Config", "current-context": "c",'
        ' "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:9"}}],'
        ' "users": [{"name": "u", "user": {"token": "t"}}],'
        ' "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}')
    return kubeconfig


def test_api_unreachable_leaves_the_old_driver_loaded_and_ready(tmp_path: Path) -> None:
    ctx = held_host(tmp_path, NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true", NODE_NAME="gpu-1",
                    NVIDIA_INSTALLER_KUBECONFIG=str(_dead_api(tmp_path)))
    with pytest.raises(ClusterApiUnavailable) as caught:
        steps.unload_old_step(ctx).apply()
    assert caught.value.exit_code == 70
    assert "could not read node gpu-1" in caught.value.message
    assert ctx.runner.calls == []  # no rmmod
    assert ctx.root.local(READY_FILE).exists()


def test_check_before_staging_refuses_a_held_driver_only_with_the_protocol_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from installer.cluster import protocol

    off = held_host(tmp_path / "off")
    assert not steps.driver_free_step(off).is_satisfied()
    with pytest.raises(DriverInUse, match="pid 4242"):
        steps.driver_free_step(off).apply()
    # On, the protocol frees the driver right before the unload: staging goes ahead once the
    # API server has answered (a read of the node, nothing written).
    on = held_host(tmp_path / "on", NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true", NODE_NAME="gpu-1")
    step = steps.driver_free_step(on)
    assert not step.is_satisfied()
    asked = []
    monkeypatch.setattr(protocol, "preflight", lambda config: asked.append(config.node_name))
    step.apply()
    assert asked == ["gpu-1"] and step.is_satisfied()


def test_a_held_upgrade_that_cannot_reach_the_api_fails_before_staging(tmp_path: Path) -> None:
    ctx = held_host(tmp_path, NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true", NODE_NAME="gpu-1",
                    NVIDIA_INSTALLER_KUBECONFIG=str(_dead_api(tmp_path)))
    with pytest.raises(ClusterApiUnavailable, match="could not read node gpu-1"):
        steps.driver_free_step(ctx).apply()
    assert not steps.driver_free_step(ctx).is_satisfied()


KERNEL = "5.15.0-105-generic"


def staged_new_module_files(ctx: Context, old_build: bool = True) -> Path:
    """The cache's builds of the loaded driver (OLD, proprietary) and of NEW (open); NEW's
    module files staged on the host as the plan does before the unload."""
    runner(ctx).on("depmod")
    builds = [(NEW, "open")] + ([(OLD, "proprietary")] if old_build else [])
    for version, flavour in builds:
        build = ctx.layout.module_build(version, KERNEL, flavour)
        build.mkdir(parents=True)
        for name in ("nvidia.ko", "nvidia-uvm.ko"):
            (build / name).write_text(f"{name} {version}")
    ctx.root.local(f"/lib/modules/{KERNEL}").mkdir(parents=True)
    steps.module_files_step(ctx).apply()
    host_dir = ctx.root.local(str(ctx.layout.host_modules_dir(KERNEL)))
    assert (host_dir / "nvidia.ko").read_text() == f"nvidia.ko {NEW}"
    return host_dir


def runner(ctx: Context) -> FakeRunner:
    assert isinstance(ctx.runner, FakeRunner)
    return ctx.runner


def depmods(ctx: Context) -> list[list[str]]:
    return [argv for argv in runner(ctx).argvs() if argv[0] == "depmod"]


def test_an_upgrade_that_cannot_make_room_puts_the_loaded_drivers_module_files_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Otherwise a reboot's modprobe would load NEW's modules under OLD's user space."""
    from installer.cluster import protocol

    ctx = held_host(tmp_path, NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true", NODE_NAME="gpu-1")
    host_dir = staged_new_module_files(ctx)

    def times_out(*args: object) -> None:
        raise DriverHoldersTimeout("pid 4242 (nvidia-device-p) holds /dev/nvidia0 after 600 s")

    monkeypatch.setattr(protocol, "make_room", times_out)
    with pytest.raises(DriverHoldersTimeout):
        steps.unload_old_step(ctx).apply()
    assert (host_dir / ".installer-stamp").read_text() == f"{OLD} proprietary\n"
    assert sorted(p.name for p in host_dir.iterdir()) == [".installer-stamp", "nvidia-uvm.ko",
                                                          "nvidia.ko"]
    assert (host_dir / "nvidia.ko").read_text() == f"nvidia.ko {OLD}"
    assert depmods(ctx) == [["depmod", "-b", str(tmp_path), KERNEL]] * 2
    assert not [argv for argv in runner(ctx).argvs() if argv[0] == "rmmod"]
    assert ctx.root.local(READY_FILE).exists()
    assert not list(host_dir.parent.glob("nvidia-driver-installer.*"))  # no .new/.old left


def test_a_refused_unload_without_the_old_build_takes_the_new_module_files_out(
        tmp_path: Path) -> None:
    ctx = held_host(tmp_path)  # protocol off: the holder appeared after check-driver-free
    host_dir = staged_new_module_files(ctx, old_build=False)
    with pytest.raises(DriverInUse):
        steps.unload_old_step(ctx).apply()
    assert not host_dir.exists()
    assert len(depmods(ctx)) == 2


def test_a_failed_unload_leaves_matching_module_files_alone(tmp_path: Path) -> None:
    ctx = held_host(tmp_path)
    host_dir = staged_new_module_files(ctx)
    steps.restore_module_files(ctx, host.LoadedDriver(NEW, "open", ""))
    assert (host_dir / ".installer-stamp").read_text() == f"{NEW} open\n"
    assert len(depmods(ctx)) == 1
