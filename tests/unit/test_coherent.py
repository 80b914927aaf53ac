"""Coherent memory on Grace-coupled GPUs (steps/coherent.py): NVreg_CoherentGPUMemoryMode=driver
from R580 unless the operator's options set it, in the plan, the nvidia module's load argv and
what verify reads back. (Their open flavour: tests/unit/test_versions.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from lib.contexts import context
from lib.fakes import FakeRunner
from lib.hosttrees import B300, GB200, GB300, GB300_595, GH200, GH200_144G, H100, pci_gpus

from installer import steps
from installer.config import from_env
from installer.hostroot import HostRoot

CDMM = "NVreg_CoherentGPUMemoryMode=driver"


# --- coherent memory -----------------------------------------------------------------------


def decide(tmp_path: Path, device_ids: tuple[int, ...], branch: int = 580, **env: str
           ) -> steps.coherent.Coherent:
    config = from_env({"ROOT_MOUNT_DIR": str(tmp_path), **env})
    return steps.coherent_memory(config, HostRoot(tmp_path), pci_gpus(*device_ids), branch)


@pytest.mark.parametrize("device_id", [GH200, GH200_144G, GB200, GB300, GB300_595])
def test_grace_coupled_gpus_get_driver_managed_memory_from_r580(tmp_path: Path,
                                                                device_id: int) -> None:
    coherent = decide(tmp_path, (device_id,))
    assert coherent.args == (CDMM,) and coherent.expected == "driver"
    assert coherent.decision.topic == "coherent-memory"
    assert coherent.decision.value == CDMM
    assert f"10de:{device_id:04x}" in coherent.decision.reason


def test_not_before_r580_nor_on_other_pci_gpus(tmp_path: Path) -> None:
    older = decide(tmp_path, (GH200,), branch=575)
    assert older.args == () and older.decision.value == "not set"
    assert "R575 predates" in older.decision.reason
    for device_id in (H100, B300, 0x2901):  # HGX boards: no Grace beside the GPU
        other = decide(tmp_path, (device_id,))
        assert other.args == () and other.decision.value == "not applicable"


def test_the_operators_module_args_win(tmp_path: Path) -> None:
    coherent = decide(tmp_path, (GB200,),
                      NVIDIA_MODULE_ARGS="nvidia.NVreg_CoherentGPUMemoryMode=numa")
    assert coherent.args == () and coherent.expected is None
    assert coherent.decision.value == "the operator's"
    assert coherent.decision.reason == \
        "NVIDIA_MODULE_ARGS sets NVreg_CoherentGPUMemoryMode=numa"


def test_the_hosts_modprobe_d_wins(tmp_path: Path) -> None:
    conf = tmp_path / "etc/modprobe.d"
    conf.mkdir(parents=True)
    (conf / "gpu.conf").write_text("# ours\noptions nvidia-drm modeset=1\n"
                                   "options nvidia NVreg_EnableGpuFirmware=1 "
                                   "NVreg_CoherentGPUMemoryMode=numa\n")
    coherent = decide(tmp_path, (GH200,))
    assert coherent.args == ()
    assert coherent.decision.reason == \
        "/etc/modprobe.d/gpu.conf sets NVreg_CoherentGPUMemoryMode=numa"
    # Another module's line, or a comment, is not the operator's setting for nvidia.
    (conf / "gpu.conf").write_text("# options nvidia NVreg_CoherentGPUMemoryMode=numa\n"
                                   "options nvidia_uvm NVreg_CoherentGPUMemoryMode=numa\n")
    assert decide(tmp_path, (GH200,)).args == (CDMM,)


def test_the_nvidia_module_is_loaded_with_it(tmp_path: Path) -> None:
    runner = FakeRunner().on("modprobe").on("insmod")
    ctx = context(tmp_path, runner, NVIDIA_MODULE_ARGS="nvidia.NVreg_EnableGpuFirmware=1")
    ctx.facts = ctx.facts._replace(gpus=tuple(pci_gpus(GH200)))
    steps.load_step(ctx).apply()
    loads = [argv for argv in runner.argvs() if "nvidia" in argv or any(
        a.endswith("/nvidia.ko") for a in argv)]
    assert len(loads) == 1, runner.argvs()
    assert loads[0][-2:] == ["NVreg_EnableGpuFirmware=1", CDMM]
    others = [argv for argv in runner.argvs() if argv not in loads]
    assert all(CDMM not in argv for argv in others)


def test_verify_reads_it_back(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    assert steps.coherent_memory_mode(root) is None  # no params file (or before R580)
    params = tmp_path / "proc/driver/nvidia/params"
    params.parent.mkdir(parents=True)
    params.write_text('ResmanDebugLevel: 4294967295\nExcludedGpus: ""\n'
                      'CoherentGPUMemoryMode: "driver"\n')
    assert steps.coherent_memory_mode(root) == "driver"


def test_the_plan_shows_it_and_why(tmp_path: Path) -> None:
    from lib.contexts import V
    from lib.hosttrees import make_host, root_env

    from installer import planner

    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", gpus=[GB200])
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=V))
    plan = planner.make_plan(config, FakeRunner(), fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)
    chosen = {d.topic: d for d in plan.decisions}
    assert chosen["kernel-module-type"].value == "open"
    assert chosen["coherent-memory"].value == CDMM
    assert chosen["coherent-memory"].reason.startswith("GB200 (10de:2941) on R580: ")
