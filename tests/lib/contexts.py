"""Contexts for step-level tests on a temp host tree: a planned install, a host whose driver is
held by a process, and processes that run from our install dir."""

from __future__ import annotations

import os
from pathlib import Path

from installer import host
from installer.config import from_env
from installer.layout import READY_FILE, Layout
from installer.plan import Context, Target
from lib import hosttrees as trees
from lib.fakes import FakeRunner

V = "580.105.08"
OLD, NEW = "550.127.05", V


def context(
    tmp_path: Path,
    runner: FakeRunner,
    *,
    secure_boot: bool = False,
    modules: tuple[str, ...] = (),
    **env: str,
) -> Context:
    """An Ubuntu 22.04 host with one H100 and a runfile install of V planned; nothing may be
    downloaded."""
    root = trees.make_host(
        tmp_path,
        distro="ubuntu-22.04",
        kernel="5.15.0-105-generic",
        gpus=[0x2330],
        modules=list(modules),
        secure_boot=secure_boot,
    )
    config = from_env(trees.root_env(tmp_path, **env))
    layout = Layout.from_config(config, root)
    facts = host.gather(root, free_space_path=tmp_path)
    target = Target(
        V,
        580,
        "open",
        "5.15.0-105-generic",
        "runfile",
        [],
        None,
        True,
        ("0000:00:04.0",),
    )

    def no_fetch(urls: list[str], dest: Path, name: str) -> Path:
        raise AssertionError("no download expected")

    return Context(config, root, layout, runner, facts, target, no_fetch)


def held_host(tmp_path: Path, **env: str) -> Context:
    """OLD is loaded and ready, pid 4242 (a device plugin) holds /dev/nvidia0, NEW is planned;
    rmmod answers success."""
    root = trees.make_host(tmp_path, gpus=[0x2330])
    modules = [trees.module_line("nvidia_uvm"), trees.module_line("nvidia")]
    trees.write_proc_modules(tmp_path, modules)
    trees.write_driver_version(tmp_path, OLD)
    trees.add_process(tmp_path, 4242, "nvidia-device-p", {3: "/dev/nvidia0"})
    ready = root.local(READY_FILE)
    ready.parent.mkdir(parents=True)
    ready.write_text(f"DRIVER_VERSION={OLD}\n")
    config = from_env(trees.root_env(tmp_path, **env))
    layout = Layout.from_config(config, root)
    facts = host.gather(root, free_space_path=tmp_path)
    target = Target(NEW, 580, "open", "5.15.0-105-generic", "runfile", [], None, True,
                    ("0000:00:04.0",))
    return Context(config, root, layout, FakeRunner().on("rmmod"), facts, target,
                   lambda *a: Path())


def our_process(root: Path, pid: int, install: str, name: str, *, script: bool = False) -> None:
    """Process PID running NAME from version V of the install dir INSTALL."""
    # A script's comm is its interpreter's (what the kit's Python stand-ins show).
    program = f"{install}/versions/{V}/bin/{name}"
    proc = trees.add_process(root, pid, "python3" if script else name[:15], {4: "/dev/nvidia0"},
                             cmdline=f"/usr/bin/python3\0{program}" if script else program)
    exe = "/usr/bin/python3.11" if script else program
    os.symlink(exe, proc / "exe")
