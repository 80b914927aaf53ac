from __future__ import annotations

import os
from pathlib import Path

import pytest
from lib.fakes import FakeRunner
from lib.hosttrees import write_proc_modules

from installer import kmod
from installer.errors import DriverInUse, ModuleLoadFailed
from installer.hostroot import HostRoot

LOADED = [
    "nvidia_modeset 1234 0 - Live 0x0 (POE)",
    "nvidia_uvm 1234 0 - Live 0x0 (POE)",
    "nvidia 5678 2 nvidia_uvm,nvidia_modeset, Live 0x0 (POE)",
]


def _root(tmp_path: Path, lines: list[str]) -> HostRoot:
    write_proc_modules(tmp_path, lines)
    return HostRoot(tmp_path)


def test_unload_goes_in_reverse_dependency_order(tmp_path: Path) -> None:
    runner = FakeRunner().on("rmmod")
    kmod.unload(_root(tmp_path, LOADED), runner, holders=[])
    assert runner.argvs() == [
        ["rmmod", "nvidia_modeset"],
        ["rmmod", "nvidia_uvm"],
        ["rmmod", "nvidia"],
    ]


def test_an_open_device_blocks_unloading_before_anything_changes(tmp_path: Path) -> None:
    held = [*LOADED[:2], "nvidia 5678 3 nvidia_uvm,nvidia_modeset, Live 0x0 (POE)"]
    runner = FakeRunner()
    with pytest.raises(DriverInUse) as info:
        kmod.unload(
            _root(tmp_path, held), runner, holders=["pid 42 (python3) holds /dev/nvidia0"]
        )
    assert runner.calls == []
    assert "pid 42 (python3)" in info.value.message
    assert "nvidia (refcount 1)" in info.value.message


def test_load_uses_the_hosts_modprobe_config_and_user_args(tmp_path: Path) -> None:
    root = _root(tmp_path, ["nvidia 5678 0 - Live 0x0 (POE)"])
    runner = FakeRunner().on("modprobe")
    request = kmod.LoadRequest("6.1", True, tmp_path, {"nvidia_uvm": ["uvm_disable_hmm=1"]})
    kmod.load(root, runner, request)
    base = ["modprobe", "-d", str(tmp_path), "-C", str(tmp_path / "etc/modprobe.d")]
    assert runner.argvs() == [[*base, "nvidia-uvm", "uvm_disable_hmm=1"], [*base, "nvidia-modeset"]]


def test_insmod_fallback_carries_modprobe_d_options(tmp_path: Path) -> None:
    root = _root(tmp_path, [])
    runner = (
        FakeRunner()
        .on("insmod")
        .on("modprobe", output="options nvidia NVreg_DeviceFileMode=0660\noptions snd x=1\n")
    )
    request = kmod.LoadRequest("6.1", False, Path("/cache/m"), {})
    kmod.load(root, runner, request)
    inserts = [a for a in runner.argvs() if a[0] == "insmod"]
    assert inserts == [
        ["insmod", "/cache/m/nvidia.ko", "NVreg_DeviceFileMode=0660"],
        ["insmod", "/cache/m/nvidia-uvm.ko"],
        ["insmod", "/cache/m/nvidia-modeset.ko"],
    ]


def test_a_refused_module_names_the_reason(tmp_path: Path) -> None:
    runner = FakeRunner().on(
        "modprobe",
        returncode=1,
        output="modprobe: ERROR: could not insert 'nvidia': No such device",
    )
    with pytest.raises(ModuleLoadFailed) as info:
        kmod.load(_root(tmp_path, []), runner, kmod.LoadRequest("6.1", True, tmp_path, {}))
    assert "No such device" in info.value.message
    assert "no GPU" in info.value.hint


def test_nvidia_modprobe_covers_every_gpu() -> None:
    assert kmod.nvidia_modprobe_argvs(Path("/i/bin/nvidia-modprobe"), 3) == [
        ["/i/bin/nvidia-modprobe", "-c=0"],
        ["/i/bin/nvidia-modprobe", "-c=1"],
        ["/i/bin/nvidia-modprobe", "-c=2"],
        ["/i/bin/nvidia-modprobe", "-c=255"],
        ["/i/bin/nvidia-modprobe", "-m"],
        ["/i/bin/nvidia-modprobe", "-u", "-c=0"],
    ]


def test_expected_nodes_use_the_dynamic_uvm_major(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc/devices").write_text("Character devices:\n195 nvidia\n508 nvidia-uvm\n")
    nodes = kmod.expected_nodes(HostRoot(tmp_path), 2)
    assert {(n.name, n.major, n.minor) for n in nodes} == {
        ("nvidiactl", 195, 255),
        ("nvidia-modeset", 195, 254),
        ("nvidia0", 195, 0),
        ("nvidia1", 195, 1),
        ("nvidia-uvm", 508, 0),
        ("nvidia-uvm-tools", 508, 1),
    }
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia0").write_text("not a device")
    assert "nvidia0" in kmod.missing_nodes(dev, nodes)
    assert os.path.exists(dev / "nvidia0")


def _char_nodes(dev: Path, nodes: list[kmod.Node]) -> None:
    if os.geteuid() != 0:
        pytest.skip("mknod of character devices needs root")
    for node in nodes:
        os.mknod(dev / node.name, 0o666 | 0o020000, os.makedev(node.major, node.minor))


NODES = [kmod.Node("nvidiactl", 195, 255), kmod.Node("nvidia0", 195, 0),
         kmod.Node("nvidia-uvm", 510, 0)]


def test_char_links_name_every_node_by_its_numbers(tmp_path: Path) -> None:
    _char_nodes(tmp_path, NODES)
    (tmp_path / "char").mkdir()
    os.symlink("../nvidia1", tmp_path / "char" / "195:0")  # stale: another node's name
    assert kmod.missing_char_links(tmp_path, NODES) == ["nvidiactl", "nvidia0", "nvidia-uvm"]
    kmod.link_char_nodes(tmp_path, NODES)
    assert kmod.missing_char_links(tmp_path, NODES) == []
    assert os.readlink(tmp_path / "char" / "195:255") == "../nvidiactl"
    assert os.readlink(tmp_path / "char" / "195:0") == "../nvidia0"
    assert os.readlink(tmp_path / "char" / "510:0") == "../nvidia-uvm"
    assert sorted(p.name for p in (tmp_path / "char").iterdir()) == ["195:0", "195:255", "510:0"]


def test_remove_nodes_takes_the_nodes_and_their_links_and_nothing_else(tmp_path: Path) -> None:
    _char_nodes(tmp_path, [*NODES, kmod.Node("null", 1, 3)])
    kmod.link_char_nodes(tmp_path, [*NODES, kmod.Node("null", 1, 3)])
    (tmp_path / "nvidia-notes").write_text("not a node")
    removed = kmod.remove_nodes(tmp_path)
    assert sorted(Path(p).name for p in removed) == sorted(
        ["195:255", "195:0", "510:0", "nvidiactl", "nvidia0", "nvidia-uvm"]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["char", "null", "nvidia-notes"]
    assert [p.name for p in (tmp_path / "char").iterdir()] == ["1:3"]
