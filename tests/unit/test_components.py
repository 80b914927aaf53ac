"""The components beside the driver, without processes: NVSwitch detection, the plan's
Fabric Manager decision and steps, the redistrib JSON, the config nv-fabricmanager runs with,
the argv of both daemons, what prune keeps, which processes are ours, and the pause."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path, PurePosixPath

import pytest
from lib.contexts import V, our_process
from lib.fakes import FakeRunner
from lib.hosttrees import (
    CLASS_3D,
    CLASS_AUDIO,
    CLASS_BRIDGE,
    GB200,
    H100,
    add_pci_device,
    add_process,
    load_driver,
    make_host,
    root_env,
    write_driver_version,
)

from installer import components, host, planner, steps
from installer.components import (
    fabricmanager_daemon,
    fm_archive,
    nvswitch,
    persistenced,
    processes,
    redist,
)
from installer.components.supervisor import (
    PAUSE_FILE,
    Driver,
    Idle,
    paused,
    ready_file,
    verified_driver,
)
from installer.config import from_env
from installer.errors import (
    ConfigError,
    FabricManagerMismatch,
    FabricManagerUnavailable,
    PersistencedFailed,
)
from installer.hostroot import HostRoot
from installer.layout import READY_FILE, Layout

H100_SWITCH = 0x22A3
A100_SWITCH = 0x1AF1


def hgx(root: Path, gpus: tuple[int, ...] = (H100, H100)) -> HostRoot:
    host_root = make_host(root, distro="debian-12", kernel="6.1.0-56-amd64", gpus=gpus)
    add_pci_device(root, "0000:05:00.0", device=H100_SWITCH, klass=CLASS_BRIDGE)
    add_pci_device(root, "0000:06:00.0", device=H100_SWITCH, klass=CLASS_BRIDGE)
    return host_root


def test_switches_are_nvidia_functions_of_class_0680(tmp_path: Path) -> None:
    root = hgx(tmp_path)
    add_pci_device(tmp_path, "0000:07:00.0", vendor=0x8086, device=0x1234, klass=CLASS_BRIDGE)
    add_pci_device(tmp_path, "0000:10:00.1", device=0x22BA, klass=CLASS_AUDIO)
    add_pci_device(tmp_path, "0000:08:00.0", device=A100_SWITCH, klass=CLASS_BRIDGE)
    found = host.pci_switches(root)
    assert [(s.address, s.device_id) for s in found] == [
        ("0000:05:00.0", 0x22A3), ("0000:06:00.0", 0x22A3), ("0000:08:00.0", 0x1AF1)]
    fabric = nvswitch.fabric(host.pci_switches(root), (H100,))
    assert fabric.needed
    assert fabric.reason == ("3 NVSwitch function(s) (10de:1af1, 10de:22a3) at 0000:05:00.0, "
                             "0000:06:00.0, 0000:08:00.0")


def test_no_switch_no_fabric_manager(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[H100])
    add_pci_device(tmp_path, "0000:20:00.0", device=H100, klass=CLASS_3D)
    fabric = nvswitch.fabric(host.pci_switches(root), (H100,))
    assert not fabric.needed and fabric.switches == ()
    assert "no NVSwitch PCI function" in fabric.reason
    assert components.fabric_required(root) == (False, ())


def test_nvl72_gpus_have_their_fabric_managed_off_the_node(tmp_path: Path) -> None:
    root = hgx(tmp_path, gpus=(GB200,))
    fabric = nvswitch.fabric(host.pci_switches(root), (GB200,))
    assert not fabric.needed
    assert "NVL72 parts" in fabric.reason and "10de:2941" in fabric.reason


def test_the_driver_list_is_preferred_for_readiness(tmp_path: Path) -> None:
    root = hgx(tmp_path)
    assert components.fabric_required(root) == (True, ("0000:05:00.0", "0000:06:00.0"))
    devices = tmp_path / "proc/driver/nvidia-nvswitch/devices"
    (devices / "0000:05:00.0").mkdir(parents=True)
    assert nvswitch.driver_switches(root) == ("0000:05:00.0",)
    assert components.fabric_required(root) == (True, ("0000:05:00.0",))


def plan_for(tmp_path: Path, **env: str) -> planner.Plan:
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=V, **env))
    return planner.make_plan(config, FakeRunner(), fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)


def test_an_hgx_plan_installs_fabric_manager_beside_the_user_space(tmp_path: Path) -> None:
    hgx(tmp_path)
    plan = plan_for(tmp_path, NVIDIA_FABRICMANAGER_REDIST="http://mirror.local/redist, "
                    "https://developer.download.nvidia.com/compute/nvidia-driver/redist")
    names = [s.name for s in plan.steps]
    assert names[names.index("install-userspace"):names.index("activate-install")] == [
        "install-userspace", "fetch-fabricmanager", "install-fabricmanager",
        "check-driver-free", "install-module-files", "install-firmware", "unload-old-driver"]
    (decision,) = [d for d in plan.decisions if d.topic == "fabric-manager"]
    assert decision.value == f"fabricmanager-linux-x86_64-{V}-archive.tar.xz"
    assert decision.reason.startswith("2 NVSwitch function(s) (10de:22a3) at 0000:05:00.0, "
                                      f"0000:06:00.0: CUDA needs Fabric Manager of exactly {V}")
    assert "http://mirror.local/redist, https://developer.download.nvidia.com" in decision.reason


def test_elsewhere_fabric_manager_is_not_planned(tmp_path: Path) -> None:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", gpus=[H100])
    plan = plan_for(tmp_path)
    assert not [s for s in plan.steps if "fabricmanager" in s.name]
    (decision,) = [d for d in plan.decisions if d.topic == "fabric-manager"]
    assert decision.value == "not applicable"


def test_fabric_manager_can_be_left_to_the_host(tmp_path: Path) -> None:
    hgx(tmp_path)
    plan = plan_for(tmp_path, NVIDIA_FABRICMANAGER="false")
    assert not [s for s in plan.steps if "fabricmanager" in s.name]
    (decision,) = [d for d in plan.decisions if d.topic == "fabric-manager"]
    assert decision.value == "off"
    with pytest.raises(ConfigError, match="NVIDIA_FABRICMANAGER='yes' is not one of auto, false"):
        plan_for(tmp_path, NVIDIA_FABRICMANAGER="yes")


def manifest(version: str = V, **entry: object) -> bytes:
    item = {"relative_path": f"fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-{version}"
            "-archive.tar.xz", "sha256": "ab" * 32, "md5": "cd" * 16, "size": "7100"}
    item.update(entry)
    return json.dumps({"release_label": version, "fabricmanager": {
        "name": "NVIDIA Fabric Manager", "version": version, "linux-x86_64": item}}).encode()


def test_the_redistrib_json_names_the_archive_and_its_checksum() -> None:
    listed = fm_archive.parse_manifest(manifest(), V, "x86_64", "m")
    assert listed == redist.Listed(
        V, f"fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-{V}-archive.tar.xz",
        "ab" * 32, 7100, "m")
    with pytest.raises(FabricManagerUnavailable, match="no fabricmanager archive for linux-sbsa"):
        fm_archive.parse_manifest(manifest(), V, "aarch64", "m")
    with pytest.raises(FabricManagerMismatch, match=r"lists fabricmanager '580\.126\.20', not"):
        fm_archive.parse_manifest(manifest("580.126.20"), V, "x86_64", "m")
    with pytest.raises(FabricManagerMismatch, match="not fabricmanager-linux-x86_64-580"):
        fm_archive.parse_manifest(manifest(relative_path="../../etc/passwd"), V, "x86_64", "m")
    with pytest.raises(FabricManagerMismatch, match="no valid sha256"):
        fm_archive.parse_manifest(manifest(sha256="nope"), V, "x86_64", "m")
    with pytest.raises(FabricManagerMismatch, match="is not JSON"):
        fm_archive.parse_manifest(b"<html>", V, "x86_64", "m")


CFG = """# comment
LOG_LEVEL=4
LOG_FILE_NAME=/var/log/fabricmanager.log
DAEMONIZE=1
# DAEMONIZE=1 in a comment stays
TOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch
FM_STAY_RESIDENT_ON_FAILURES=0
"""


def test_the_config_runs_it_in_the_foreground_with_the_operators_overrides() -> None:
    values = fabricmanager_daemon.overrides(
        {"NVFM_CONFIG_FM_STAY_RESIDENT_ON_FAILURES": "1", "NVFM_CONFIG_LOG_LEVEL": "3",
         "NVFM_CONFIG_ABORT_CUDA_JOBS_ON_FM_EXIT": "0", "OTHER": "x"}, Path("/inst/nvswitch"))
    assert fabricmanager_daemon.render(CFG, values) == """# comment
LOG_LEVEL=3
LOG_FILE_NAME=
DAEMONIZE=0
# DAEMONIZE=1 in a comment stays
TOPOLOGY_FILE_PATH=/inst/nvswitch
FM_STAY_RESIDENT_ON_FAILURES=1
ABORT_CUDA_JOBS_ON_FM_EXIT=0
"""


@pytest.mark.parametrize("env,message", [
    ({"NVFM_CONFIG_DAEMONIZE": "1"}, "NVFM_CONFIG_DAEMONIZE cannot be set"),
    ({"NVFM_CONFIG_LOG_FILE_NAME": "/x"}, "NVFM_CONFIG_LOG_FILE_NAME cannot be set"),
    ({"NVFM_CONFIG_lower": "1"}, "upper-case keys"),
    ({"NVFM_CONFIG_LOG_LEVEL": "4\nDAEMONIZE=1"}, "one-line values"),
])
def test_overrides_that_would_break_the_supervisor_are_refused(env: dict[str, str],
                                                               message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        fabricmanager_daemon.overrides(env, Path("/t"))


def test_the_daemons_argv() -> None:
    assert fabricmanager_daemon.argv(Path("/i/versions/1/bin/nv-fabricmanager"),
                                     Path("/t/fm.cfg")) == [
        "/i/versions/1/bin/nv-fabricmanager", "-c", "/t/fm.cfg"]
    assert persistenced.argv(Path("/i/bin/nvidia-persistenced")) == [
        "/i/bin/nvidia-persistenced", "--persistence-mode", "--verbose"]


def test_prune_keeps_the_installed_versions_fabric_manager_archive(tmp_path: Path) -> None:
    from lib.contexts import context

    ctx = context(tmp_path, FakeRunner())
    downloads = ctx.layout.downloads
    downloads.mkdir(parents=True)
    keep = [f"fabricmanager-linux-x86_64-{V}-archive.tar.xz",
            f"fabricmanager-linux-x86_64-{V}-archive.tar.xz.download.json",
            f"NVIDIA-Linux-x86_64-{V}.run"]
    drop = ["fabricmanager-linux-x86_64-550.127.05-archive.tar.xz",
            "fabricmanager-linux-x86_64-550.127.05-archive.tar.xz.download.json"]
    for name in keep + drop:
        (downloads / name).write_text("x")
    step = steps.prune_step(ctx)
    assert not step.is_satisfied()
    step.apply()
    assert sorted(p.name for p in downloads.iterdir()) == sorted(keep)
    assert step.is_satisfied()


def test_our_daemons_are_known_by_their_program_in_the_install_dir(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[H100])
    config = from_env(root_env(tmp_path))
    layout = Layout.from_config(config, root)
    install = str(layout.install_host)
    our_process(tmp_path, 100, install, "nv-fabricmanager")
    our_process(tmp_path, 101, install, "nvidia-persistenced", script=True)
    # The host's own persistenced (its package), and a GPU client: not ours.
    proc = add_process(tmp_path, 102, "nvidia-persiste", {4: "/dev/nvidia0"},
                       cmdline="/usr/bin/nvidia-persistenced")
    os.symlink("/usr/bin/nvidia-persistenced", proc / "exe")
    add_process(tmp_path, 103, "python3", {5: "/dev/nvidia0"})
    # The DaemonSet's container sees the install dir at NVIDIA_INSTALL_DIR_CONTAINER.
    our_process(tmp_path, 104, str(config.install_dir_container), "nv-fabricmanager")
    found = processes.find(root, ("nv-fabricmanager", "nvidia-persistenced"),
                           (layout.install_host,))
    assert [(d.pid, d.name) for d in found] == [(100, "nv-fabricmanager"),
                                                (101, "nvidia-persistenced")]
    from installer import host

    holders = host.holders_of(root, "/dev/nvidia")
    assert [h.pid for h in components.not_ours(root, layout, config, holders)] == [102, 103]
    assert components.our_daemons(root, layout, config) == {100, 101, 104}


def test_status_shows_what_the_daemons_said(tmp_path: Path) -> None:
    from installer import app

    root = make_host(tmp_path, gpus=[H100])
    config = from_env(root_env(tmp_path))
    root.write_atomic(ready_file("fabricmanager"), f"DRIVER_VERSION={V}\nSTATE=running\n")
    assert app.status(config)["daemons"] == {
        "fabricmanager": {"DRIVER_VERSION": V, "STATE": "running"}, "persistenced": None,
        "imex": None}


def test_a_driver_held_only_by_our_daemons_is_free_to_replace(tmp_path: Path) -> None:
    from lib.contexts import context

    ctx = context(tmp_path, FakeRunner())
    load_driver(tmp_path, "550.127.05", uvm=False, holders=2)
    our_process(tmp_path, 100, str(ctx.layout.install_host), "nvidia-persistenced")
    assert steps.driver_free_step(ctx).is_satisfied()
    add_process(tmp_path, 103, "python3", {5: "/dev/nvidia0"})
    assert not steps.driver_free_step(ctx).is_satisfied()


def test_the_readiness_file_names_the_driver_the_daemons_follow(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[H100])
    assert verified_driver(root) is None
    root.write_atomic(READY_FILE, f"DRIVER_VERSION={V}\nKERNEL_MODULE_TYPE=open\n"
                      "KERNEL_RELEASE=6.1.0\nINSTALL_DIR=/home/kubernetes/bin/nvidia\n")
    assert verified_driver(root) is None  # written, but the driver is not loaded (any more)
    write_driver_version(tmp_path, "550.127.05")
    assert verified_driver(root) is None  # another version is loaded
    write_driver_version(tmp_path, V)
    driver = verified_driver(root)
    assert driver is not None and driver.version == V
    assert driver.install_dir == PurePosixPath("/home/kubernetes/bin/nvidia")
    assert ready_file("fabricmanager") == PurePosixPath(
        "/run/nvidia-driver-installer/fabricmanager-ready")


def test_a_pause_lasts_while_its_installer_holds_the_host_lock(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[H100])
    lock = tmp_path / "install/.installer.lock"
    lock.parent.mkdir()
    assert not paused(root, lock)
    root.write_atomic(PAUSE_FILE, "INSTALLER_PID=1\n")
    with open(lock, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert paused(root, lock)
        assert paused(root, lock)  # and it stays
    # The installer is gone (its lock released): the pause file is stale and removed.
    assert not paused(root, lock)
    assert not root.local(PAUSE_FILE).exists()


def test_persistenced_can_be_left_to_the_host(tmp_path: Path) -> None:
    """NVIDIA_INSTALLER_PERSISTENCED=false: the plan says so, the container idles as
    not-applicable (so the gate does not wait for it), and the host's own daemon is a holder."""
    hgx(tmp_path)
    (on,) = [d for d in plan_for(tmp_path).decisions if d.topic == "persistenced"]
    assert on.value == "on"
    plan = plan_for(tmp_path, NVIDIA_INSTALLER_PERSISTENCED="false")
    (off,) = [d for d in plan.decisions if d.topic == "persistenced"]
    assert off.value == "off" and "host manages persistence" in off.reason
    config = from_env(root_env(tmp_path, NVIDIA_INSTALLER_PERSISTENCED="false"))
    assert config.persistenced is False
    daemon = persistenced.PersistencedDaemon(config, HostRoot(tmp_path))
    idle = daemon.plan(Driver(V, PurePosixPath("/var/lib/nvidia")))
    assert idle == Idle("NVIDIA_INSTALLER_PERSISTENCED=false (the host manages persistence)")
    # On (the default) with no install of V, it cannot start: what an operator sees today.
    with pytest.raises(PersistencedFailed, match="has no nvidia-persistenced"):
        persistenced.PersistencedDaemon(from_env(root_env(tmp_path)), HostRoot(tmp_path)).plan(
            Driver(V, PurePosixPath("/var/lib/nvidia")))
    with pytest.raises(ConfigError, match="NVIDIA_INSTALLER_PERSISTENCED='maybe' must be true"):
        from_env(root_env(tmp_path, NVIDIA_INSTALLER_PERSISTENCED="maybe"))
