"""A load the kernel refuses: the kernel's own words in the error, and the node as
it was before the run (links, module files, firmware, ld drop-in; no readiness file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from lib.contexts import context
from lib.fakes import FakeRunner

from installer import dirs, kmod, state, steps
from installer.errors import ModuleLoadFailed
from installer.host import kmsg
from installer.layout import LD_DROP_IN, READY_FILE
from installer.plan import Context

V = "580.105.08"
OLD = "570.195.03"
K = "5.15.0-105-generic"
REFUSED = "modprobe: ERROR: could not insert 'nvidia': No such device"


def kernel_logs(path: Path, *messages: str) -> None:
    """Records as /dev/kmsg gives them (priority,seq,usec,flags;text, dictionary lines)."""
    with path.open("a") as handle:
        for seq, message in enumerate(messages):
            handle.write(f"6,{1000 + seq},123456,-;{message}\n SUBSYSTEM=pci\n")


def test_the_kernel_log_since_the_watch_began(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    kernel_logs(log, "NVRM: an old message")
    with kmsg.watching(log) as watch:
        kernel_logs(log, "nvidia-nvlink: Nvlink Core is being initialized, major device "
                    "number 244", "usb 1-1: unrelated", "NVRM: No NVIDIA GPU found.")
        assert watch.lines() == ["nvidia-nvlink: Nvlink Core is being initialized, major "
                                 "device number 244", "NVRM: No NVIDIA GPU found."]
    with kmsg.watching(tmp_path / "absent") as watch:
        assert watch.lines() == []


def test_a_refused_load_quotes_the_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "kmsg"
    log.touch()
    monkeypatch.setattr(kmsg, "KMSG", log)
    from lib.hosttrees import make_host

    root = make_host(tmp_path / "host", distro="debian-12", kernel=K)
    runner = FakeRunner().on("modprobe", returncode=1, output=REFUSED,
                             effect=lambda argv: kernel_logs(log, "NVRM: No NVIDIA GPU found."))
    with pytest.raises(ModuleLoadFailed) as info:
        kmod.load(root, runner, kmod.LoadRequest(K, True, tmp_path, {}))
    assert info.value.message == (f"loading nvidia failed: {REFUSED}; the kernel logged: "
                                  "NVRM: No NVIDIA GPU found.")
    assert "found no NVIDIA GPU" in info.value.hint


def stage(ctx: Context, version: str) -> None:
    """What build-modules and install-userspace leave in the install dir for `version`."""
    build = ctx.layout.module_build(version, K, "open")
    build.mkdir(parents=True)
    for name in ("nvidia", "nvidia-uvm", "nvidia-modeset"):
        (build / f"{name}.ko").write_bytes(f"{name} {version}".encode())
    (build / dirs.COMPLETE_MARKER).write_text(f"{version} {K} open\n")
    version_dir = ctx.layout.version_dir(version)
    (version_dir / "lib64").mkdir(parents=True)
    (version_dir / "bin").mkdir()
    (version_dir / "firmware").mkdir()
    (version_dir / "firmware/gsp_ga10x.bin").write_bytes(b"gsp " + version.encode())


def staged_then_refused(ctx: Context) -> ModuleLoadFailed:
    (ctx.root.root / f"lib/modules/{K}").mkdir(parents=True, exist_ok=True)
    for step in (steps.module_files_step(ctx), steps.firmware_step(ctx),
                 steps.activate_step(ctx), steps.ld_cache_step(ctx)):
        step.apply()
    with pytest.raises(ModuleLoadFailed) as info:
        steps.load_step(ctx).apply()
    return info.value


def runner() -> FakeRunner:
    return (FakeRunner().on("depmod").on("ldconfig")
            .on("modprobe", returncode=1, output=REFUSED))


def test_a_cold_node_is_left_as_it_was(tmp_path: Path) -> None:
    ctx = context(tmp_path, runner())
    stage(ctx, V)
    install, root = ctx.layout.install_local, ctx.root
    error = staged_then_refused(ctx)
    assert error.message.startswith(f"loading nvidia failed: {REFUSED}; put back: ")
    for name in ("current", "bin", "lib64", "drivers"):
        assert not (install / name).exists() and not (install / name).is_symlink(), name
    assert not root.local(ctx.layout.host_modules_dir(K)).exists()
    assert not root.local(ctx.layout.host_firmware_dir(V)).exists()
    # Nor the directories a first install made on the way (mkdir -p).
    assert not root.local(f"/lib/modules/{K}/updates").exists()
    assert root.local(f"/lib/modules/{K}").is_dir()
    assert not root.local("/lib/firmware/nvidia").exists()
    assert not root.local(LD_DROP_IN).exists()
    assert not root.local(READY_FILE).exists()
    assert (install / "versions" / V).is_dir()  # staged in the install dir, kept for a retry


def test_an_upgrade_puts_the_previous_install_back(tmp_path: Path) -> None:
    ctx = context(tmp_path, runner())
    stage(ctx, OLD)
    install = ctx.layout.install_local
    for name, dest in (("current", f"versions/{OLD}"), ("bin", "current/bin"),
                       ("lib64", "current/lib64"),
                       ("drivers", f"cache/modules/{OLD}/{K}/open")):
        os.symlink(dest, install / name)
    state.write_record(ctx.layout.state_file, state.InstallRecord(
        OLD, "open", K, "runfile", str(ctx.layout.install_host)))
    ctx.root.local(LD_DROP_IN).parent.mkdir(parents=True, exist_ok=True)
    ctx.root.local(LD_DROP_IN).write_text("/home/kubernetes/bin/nvidia/lib64\n")
    ctx.root.local(READY_FILE).parent.mkdir(parents=True, exist_ok=True)
    ctx.root.local(READY_FILE).write_text("ready\n")
    stage(ctx, V)

    staged_then_refused(ctx)

    assert os.readlink(install / "current") == f"versions/{OLD}"
    assert os.readlink(install / "drivers") == f"cache/modules/{OLD}/{K}/open"
    host_modules = ctx.root.local(ctx.layout.host_modules_dir(K))
    assert (host_modules / "nvidia.ko").read_bytes() == f"nvidia {OLD}".encode()
    assert ctx.root.local(LD_DROP_IN).exists()  # it was there before: kept
    assert not ctx.root.local(ctx.layout.host_firmware_dir(V)).exists()
    assert not ctx.root.local(READY_FILE).exists()
    assert json.loads(ctx.layout.state_file.read_text())["version"] == OLD
