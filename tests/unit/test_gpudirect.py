"""GPUDirect RDMA (components/gpudirect.py) on posed hosts: the Mellanox device in sysfs, how the
host's ib_core announces MOFED/DOCA-OFED (its peer-memory symbol, ofed_info, the OFED
container's ready file), the bounded wait, the refusal on the kernel's own ib_core, the load
after the driver's modules, the OFED sources bound into the build, and what verify reports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lib.contexts import V, context
from lib.fakes import FakeRunner
from lib.hosttrees import CLASS_BRIDGE, add_pci_device, make_host, root_env

from installer import planner
from installer.components import gpudirect
from installer.config import from_env
from installer.errors import OfedNotReady, PeermemLoadFailed, PeermemNeedsOfed
from installer.headers import trees
from installer.hostroot import HostRoot
from installer.plan import Headers

CX7 = 0x1021  # ConnectX-7
MAINLINE_KALLSYMS = "0000000000000000 T ib_register_client\t[ib_core]\n"
MOFED_KALLSYMS = MAINLINE_KALLSYMS + (
    "0000000000000000 T ib_register_peer_memory_client\t[ib_core]\n")


def with_nic(top: Path) -> None:
    add_pci_device(top, "0000:1a:00.0", vendor=0x15B3, device=CX7, klass=0x020700,
                   subsystem_vendor=0x15B3, subsystem_device=0x0021)


def ib_core(top: Path, kallsyms: str) -> None:
    (top / "sys/module/ib_core").mkdir(parents=True, exist_ok=True)
    (top / "proc").mkdir(exist_ok=True)
    (top / "proc/kallsyms").write_text(kallsyms)


def test_mellanox_functions_are_read_from_sysfs(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[0x2330])
    add_pci_device(tmp_path, "0000:05:00.0", device=0x22A3, klass=CLASS_BRIDGE)  # NVSwitch
    assert gpudirect.mellanox_functions(root) == ()
    with_nic(tmp_path)
    assert gpudirect.mellanox_functions(root) == ("0000:1a:00.0",)


@pytest.mark.parametrize(("pose", "state", "said"), [
    ({}, "waiting", "ib_core is not loaded and no OFED is installed"),
    ({"kallsyms": MAINLINE_KALLSYMS}, "mainline", "the loaded ib_core is the kernel's own"),
    ({"kallsyms": MOFED_KALLSYMS}, "mofed", "exports ib_register_peer_memory_client"),
    # MOFED installed, the kernel's ib_core still loaded (OFED's openibd has not run yet).
    ({"kallsyms": MAINLINE_KALLSYMS, "ofed_info": True}, "waiting",
     "installed (/usr/bin/ofed_info): waiting for OFED's modules"),
    # The Network Operator's OFED container: ready once it says so.
    ({"kallsyms": MOFED_KALLSYMS, "container": True}, "waiting", "has not loaded its modules"),
    ({"kallsyms": MOFED_KALLSYMS, "container": True, "ready": True}, "mofed", "exports"),
])
def test_how_the_hosts_ofed_announces_itself(tmp_path: Path, pose: dict[str, object],
                                             state: str, said: str) -> None:
    root = make_host(tmp_path, gpus=[0x2330])
    if "kallsyms" in pose:
        ib_core(tmp_path, str(pose["kallsyms"]))
    if pose.get("ofed_info"):
        (tmp_path / "usr/bin").mkdir(parents=True)
        (tmp_path / "usr/bin/ofed_info").write_text("#!/bin/sh\necho MLNX_OFED_LINUX-24.10\n")
    if pose.get("container"):
        (tmp_path / "run/mellanox/drivers").mkdir(parents=True)
    if pose.get("ready"):
        (tmp_path / "run/mellanox/drivers/.driver-ready").write_text("")
    found = gpudirect.ofed(root)
    assert found.state == state
    assert said in found.reason


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_kernels_own_ib_core_is_refused_at_once_naming_dma_buf(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[0x2330])
    ib_core(tmp_path, MAINLINE_KALLSYMS)
    clock = Clock()
    with pytest.raises(PeermemNeedsOfed) as info:
        gpudirect.wait_for_ofed(root, 300, clock, clock.sleep)
    assert clock.slept == []  # nothing to wait for
    assert info.value.message.startswith("nvidia-peermem cannot work on this node: the loaded "
                                         "ib_core is the kernel's own")
    assert "DMA-BUF" in info.value.hint and "no extra module" in info.value.hint
    assert (info.value.reference, info.value.exit_code) == ("peermem-needs-ofed", 38)


def test_the_wait_for_ofed_is_bounded(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[0x2330])
    clock = Clock()
    with pytest.raises(OfedNotReady) as info:
        gpudirect.wait_for_ofed(root, 12, clock, clock.sleep)
    assert clock.slept == [5.0, 5.0, 2.0] and clock.now == 12
    assert info.value.message == ("no MOFED/DOCA-OFED ib_core after 12 s: ib_core is not "
                                  "loaded and no OFED is installed")
    assert (info.value.reference, info.value.exit_code) == ("ofed-not-ready", 39)


def test_ofed_coming_up_during_the_wait_ends_it(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[0x2330])
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 10:  # OFED's modules load 10 s in
            ib_core(tmp_path, MOFED_KALLSYMS)

    assert gpudirect.wait_for_ofed(root, 300, clock, sleep).state == "mofed"
    assert clock.now == 10


def _loaded_by(top: Path) -> FakeRunner:
    def load(argv: list[str]) -> None:  # what the kernel shows once nvidia-peermem is in
        if "--showconfig" in argv:  # insmod's fallback reads modprobe.d's options first
            return
        (top / "sys/module/nvidia_peermem").mkdir(parents=True)
        (top / "sys/module/nvidia_peermem/version").write_text(f"{V}\n")

    return FakeRunner().on("modprobe", effect=load).on("insmod", effect=load)


def test_peermem_is_loaded_after_mofed_and_then_satisfied(tmp_path: Path) -> None:
    runner = _loaded_by(tmp_path)
    ctx = context(tmp_path, runner, NVIDIA_GPUDIRECT_RDMA="true",
                  NVIDIA_MODULE_ARGS="nvidia-peermem.peerdirect_support=1")
    with_nic(tmp_path)
    ib_core(tmp_path, MOFED_KALLSYMS)
    [step] = gpudirect.COMPONENT.loaded_steps(ctx)
    assert step.name == "load-peermem" and not step.is_satisfied()
    step.apply()
    loads = [c.argv for c in runner.calls if c.argv[0] in ("modprobe", "insmod")
             and "--showconfig" not in c.argv]
    assert len(loads) == 1
    load = loads[0]
    assert load[-2:] == ["nvidia-peermem", "peerdirect_support=1"] if load[0] == "modprobe" \
        else load[1].endswith("/nvidia-peermem.ko") and load[-1] == "peerdirect_support=1"
    assert step.is_satisfied()
    assert gpudirect.loaded(ctx.root) == V


def test_no_load_is_tried_on_the_kernels_own_ib_core(tmp_path: Path) -> None:
    runner = _loaded_by(tmp_path)
    ctx = context(tmp_path, runner, NVIDIA_GPUDIRECT_RDMA="true")
    with_nic(tmp_path)
    ib_core(tmp_path, MAINLINE_KALLSYMS)
    [step] = gpudirect.COMPONENT.loaded_steps(ctx)
    with pytest.raises(PeermemNeedsOfed):
        step.apply()
    assert [c for c in runner.calls if c.argv[0] in ("modprobe", "insmod")] == []
    assert not (tmp_path / "sys/module/nvidia_peermem").exists()


def test_a_refused_peermem_is_its_own_error(tmp_path: Path) -> None:
    runner = FakeRunner().on("modprobe", returncode=1,
                             output="modprobe: ERROR: could not insert 'nvidia_peermem': "
                                    "Invalid argument").on("insmod", returncode=1,
                                                           output="Invalid argument")
    ctx = context(tmp_path, runner, NVIDIA_GPUDIRECT_RDMA="true")
    with_nic(tmp_path)
    ib_core(tmp_path, MOFED_KALLSYMS)
    with pytest.raises(PeermemLoadFailed) as info:
        gpudirect.COMPONENT.loaded_steps(ctx)[0].apply()
    assert "loading nvidia-peermem failed" in info.value.message
    assert "Invalid argument" in info.value.message
    assert "/usr/src/ofa_kernel" in info.value.hint
    assert (info.value.reference, info.value.exit_code) == ("peermem-load-failed", 49)


def test_without_the_setting_or_a_mellanox_device_nothing_is_asked(tmp_path: Path) -> None:
    ctx = context(tmp_path, FakeRunner())
    assert gpudirect.COMPONENT.loaded_steps(ctx) == []
    assert gpudirect.COMPONENT.decision(ctx).value == "off"
    on = context(tmp_path / "on", FakeRunner(), NVIDIA_GPUDIRECT_RDMA="true")
    [step] = gpudirect.COMPONENT.loaded_steps(on)
    assert step.is_satisfied()  # no 15b3 function: nothing to load
    assert gpudirect.COMPONENT.decision(on).value == "not applicable"


def test_the_plan_loads_peermem_right_after_the_drivers_modules(tmp_path: Path) -> None:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", gpus=[0x2330])
    with_nic(tmp_path)
    (tmp_path / "usr/src/ofa_kernel/default").mkdir(parents=True)
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=V, NVIDIA_GPUDIRECT_RDMA="true"))
    plan = planner.make_plan(config, FakeRunner(), fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)
    names = [s.name for s in plan.steps]
    at = names.index("load-peermem")
    assert names[at - 1:at + 2] == ["load-modules", "load-peermem", "create-device-nodes"]
    [said] = [d for d in plan.decisions if d.topic == "gpudirect-rdma"]
    assert said.value == "nvidia-peermem"
    assert "1 Mellanox function(s) (0000:1a:00.0)" in said.reason
    assert "built against the host's OFED sources (/usr/src/ofa_kernel)" in said.reason


def test_the_hosts_ofed_sources_are_bound_into_the_build(tmp_path: Path) -> None:
    ctx = context(tmp_path, FakeRunner(), NVIDIA_GPUDIRECT_RDMA="true")
    headers = Headers(output_path=trees.PurePosixPath("/usr/src/linux-headers-5.15.0-105"),
                      source_path=trees.PurePosixPath("/usr/src/linux-headers-5.15.0-105"),
                      binds=(trees.PurePosixPath("/usr/src/linux-headers-5.15.0-105"),))
    assert gpudirect.with_ofed_sources(ctx, headers) is headers  # the host has none
    (tmp_path / "usr/src/ofa_kernel/x86_64/5.15.0-105-generic").mkdir(parents=True)
    bound = gpudirect.with_ofed_sources(ctx, headers)
    assert bound.binds[-1] == trees.PurePosixPath("/usr/src/ofa_kernel")
    argv = trees.with_host_trees(ctx.root, bound, ["make"])
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert [str(tmp_path / "usr/src/ofa_kernel"), "/usr/src/ofa_kernel"] == argv[-3:-1]
    off = context(tmp_path / "off", FakeRunner())
    assert gpudirect.with_ofed_sources(off, headers) is headers


def test_verify_reports_peermem_and_a_missing_one_is_a_problem(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[0x2330])
    assert gpudirect.report(False, root) == (None, None)
    with_nic(tmp_path)
    ib_core(tmp_path, MOFED_KALLSYMS)
    section, problem = gpudirect.report(True, root)
    assert section == {"requested": True, "mellanox_functions": ["0000:1a:00.0"],
                       "ib_core": "mofed", "peermem_version": None,
                       "version_file": "/sys/module/nvidia_peermem/version"}
    assert problem is not None and "nvidia-peermem is not loaded" in problem
    os.makedirs(tmp_path / "sys/module/nvidia_peermem")
    (tmp_path / "sys/module/nvidia_peermem/version").write_text(f"{V}\n")
    section, problem = gpudirect.report(True, HostRoot(tmp_path))
    assert section is not None and section["peermem_version"] == V and problem is None


def test_installer_verify_says_it_and_fails_without_peermem(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from installer import app, verify
    from installer.verify.report import VerifyReport

    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", gpus=[0x2330])
    with_nic(tmp_path)
    ib_core(tmp_path, MOFED_KALLSYMS)
    answered = VerifyReport(expected_version=V, expected_gpus=(), nvml_driver_version=V,
                            smi_driver_version=V, gpus=(), problems=())
    monkeypatch.setattr(verify, "verify", lambda **kwargs: answered)
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=V, NVIDIA_GPUDIRECT_RDMA="true"))
    report = app.verify_installed(config)
    assert not report.ok
    assert report.problems[-1].startswith("GPUDirect RDMA is asked for and a Mellanox device is "
                                          "present, but nvidia-peermem is not loaded")
    assert report.to_json()["gpudirect_rdma"]["ib_core"] == "mofed"
    (tmp_path / "sys/module/nvidia_peermem").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia_peermem/version").write_text(f"{V}\n")
    report = app.verify_installed(config)
    assert report.ok and report.to_json()["gpudirect_rdma"]["peermem_version"] == V


def test_an_upgrade_unloads_peermem_before_the_driver(tmp_path: Path) -> None:
    from lib.hosttrees import write_proc_modules

    from installer import kmod

    write_proc_modules(tmp_path, [
        "nvidia_peermem 16384 0 - Live 0x0 (OE)",
        "nvidia_modeset 1234 0 - Live 0x0 (POE)",
        "nvidia_uvm 1234 0 - Live 0x0 (POE)",
        "nvidia 5678 3 nvidia_peermem,nvidia_uvm,nvidia_modeset, Live 0x0 (POE)",
    ])
    runner = FakeRunner().on("rmmod")
    kmod.unload(HostRoot(tmp_path), runner, holders=[])
    assert runner.argvs()[0] == ["rmmod", "nvidia_peermem"]
    assert runner.argvs()[-1] == ["rmmod", "nvidia"]
