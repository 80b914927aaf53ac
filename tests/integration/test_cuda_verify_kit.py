"""The CUDA check of `installer verify` for real: the child loads the kit's libcuda.so.1 (or
NVIDIA's real 535 one) through ctypes, JIT-loads the PTX kernel, launches it on every GPU and
compares what comes back; the kit's libcuda answers from the kit's kernel state under its
test-only root, with cuda.h's error codes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from kit import fabric
from kit.fake_host import TEST_ROOT_ENV, FakeGpu, write_loaded_driver
from lib import kituserspace

from installer.errors import VerificationFailed
from installer.runner import SubprocessRunner
from installer.verify import require_ok, verify
from installer.verify.report import VerifyReport

VERSION = "580.105.08"
H100 = [FakeGpu("0000:18:00.0", 0x2330, "NVIDIA H100 80GB HBM3", 0),
        FakeGpu("0000:2a:00.0", 0x2330, "NVIDIA H100 80GB HBM3", 1)]
SWITCHES = [fabric.FakeSwitch("0000:05:00.0")]


pytestmark = kituserspace.skip_without_tools()


@pytest.fixture(scope="module")
def install_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nvidia-smi, the kit's NVML and libcuda of VERSION in <install>/bin and lib64."""
    return kituserspace.installed(tmp_path_factory, VERSION)


def node(root: Path, *, state: int | None = None, switches: bool = False) -> Path:
    write_loaded_driver(root, VERSION, H100)
    if switches:
        fabric.write_driver_switches(root, SWITCHES)
    for gpu in H100:
        fabric.write_gpu_state(root, gpu.address, fabric_supported=state is not None,
                               fabric_state=state or 0)
    return root


def check(install_dir: Path, root: Path, **options: bool) -> VerifyReport:
    runner = SubprocessRunner(base_env={**os.environ, TEST_ROOT_ENV: str(root)})
    return verify(install_dir=install_dir, expected_version=VERSION,
                  expected_gpus=[g.address for g in H100], runner=runner, **options)


OK_BLOCK = {"ok": True, "error": None, "name": None, "meaning": None}


def test_the_kernel_runs_on_every_gpu(install_dir: Path, tmp_path: Path) -> None:
    report = check(install_dir, node(tmp_path))

    assert report.ok, report.problems
    document = report.to_json()
    assert [g["cuda"] for g in document["gpus"]] == [OK_BLOCK, OK_BLOCK]
    assert document["cuda"] == {"library": str(install_dir / f"lib64/libcuda.so.{VERSION}"),
                                "ok": True, "failure_expected": False, "error": None}
    assert report.summary_lines()[-1].endswith("and runs a CUDA kernel on each")


def test_802_on_an_nvswitch_board_before_fabric_manager(install_dir: Path,
                                                         tmp_path: Path) -> None:
    root = node(tmp_path, state=fabric.NOT_STARTED, switches=True)

    report = check(install_dir, root, fabric_required=True, require_fabric=True)

    cuda_problem = report.problems[-1]
    assert cuda_problem.startswith(
        "CUDA cuInit failed: CUDA_ERROR_SYSTEM_NOT_READY (802): system not yet initialized: ")
    assert "Fabric Manager" in cuda_problem
    blocks = [g["cuda"] for g in report.to_json()["gpus"]]
    assert [(b["ok"], b["call"], b["error"], b["name"]) for b in blocks] == [
        (False, "cuInit", 802, "CUDA_ERROR_SYSTEM_NOT_READY")] * 2
    assert all("NVLink fabric" in b["meaning"] for b in blocks)
    with pytest.raises(VerificationFailed, match="CUDA_ERROR_SYSTEM_NOT_READY") as raised:
        require_ok(report)
    assert raised.value.reference == "verification-failed"


def test_802_is_expected_while_fabric_manager_has_not_started(install_dir: Path,
                                                              tmp_path: Path) -> None:
    # Install time on an NVSwitch node: the long-running container starts Fabric Manager after
    # the driver is verified, so cuInit cannot succeed yet.
    root = node(tmp_path, state=fabric.NOT_STARTED, switches=True)

    report = check(install_dir, root, fabric_starts_later=True)

    assert report.ok, report.problems
    assert report.to_json()["cuda"]["failure_expected"] is True
    assert any(line.startswith("CUDA: cuInit failed: CUDA_ERROR_SYSTEM_NOT_READY (802)")
               for line in report.summary_lines())


def test_802_is_expected_at_install_time_while_any_fabric_is_incomplete(
        install_dir: Path, tmp_path: Path) -> None:
    # A board without NVSwitch PCI functions (HGX B200, an NVL72 tray) whose GPUs report a
    # fabric not yet complete: the run's verify-driver step does not require the fabric (the
    # fabricmanager container waits for it), so its 802 is expected there too; `installer
    # verify` (require_fabric) fails on both.
    root = node(tmp_path, state=fabric.IN_PROGRESS)

    assert check(install_dir, root).ok
    strict = check(install_dir, root, require_fabric=True)
    assert not strict.ok
    assert strict.problems[-1].startswith("CUDA cuInit failed: CUDA_ERROR_SYSTEM_NOT_READY")


def test_missing_gpu_device_nodes_mean_no_device(install_dir: Path, tmp_path: Path) -> None:
    # NVML and nvidia-smi need only /dev/nvidiactl; CUDA opens each /dev/nvidia<minor>.
    root = node(tmp_path)
    for gpu in H100:
        (root / f"dev/nvidia{gpu.minor}").unlink()

    report = check(install_dir, root)

    assert len(report.problems) == 1
    assert report.problems[0].startswith(
        "CUDA cuInit failed: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected: "
        "CUDA finds no usable GPU: the nvidia module sees none, device nodes (/dev/nvidia*)")


def test_one_missing_device_node_hides_one_gpu(install_dir: Path, tmp_path: Path) -> None:
    root = node(tmp_path)
    (root / "dev/nvidia1").unlink()

    report = check(install_dir, root)

    assert report.problems == (
        f"GPU 1 ({H100[1].address}): CUDA does not enumerate it, though NVML does",)
    assert [g["cuda"]["ok"] for g in report.to_json()["gpus"]] == [True, False]


def test_a_missing_ptx_jit_compiler_is_named(install_dir: Path, tmp_path: Path) -> None:
    lib64 = tmp_path / "install" / "lib64"
    shutil.copytree(install_dir, tmp_path / "install", symlinks=True)
    for link in lib64.glob("libnvidia-ptxjitcompiler.so*"):
        link.unlink()

    report = check(tmp_path / "install", node(tmp_path / "host"))

    assert report.problems == tuple(
        f"CUDA on GPU {g.address}: cuModuleLoadData failed: CUDA_ERROR_JIT_COMPILER_NOT_FOUND "
        "(221): PTX JIT compiler library not found: the PTX JIT compiler library "
        "(libnvidia-ptxjitcompiler.so.1) is not installed" for g in H100)


def test_the_kit_library_refuses_what_the_real_one_refuses(install_dir: Path,
                                                           tmp_path: Path) -> None:
    """Calls out of order or with foreign handles get cuda.h's codes, not success."""
    root = node(tmp_path)
    script = r"""
import ctypes, json
lib = ctypes.CDLL("libcuda.so.1")
n, dev, ctx, mod, fn, ptr = (ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p(),
                             ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64())
out = {"count_before_init": lib.cuDeviceGetCount(ctypes.byref(n)),
       "init_flags": lib.cuInit(1), "init": lib.cuInit(0)}
out["bad_ordinal"] = lib.cuDeviceGet(ctypes.byref(dev), 7)
out["alloc_without_context"] = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64))
lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
lib.cuCtxSetCurrent(ctx)
out["not_ptx"] = lib.cuModuleLoadData(ctypes.byref(mod), b"hello")
lib.cuModuleLoadData(ctypes.byref(mod), b".version 6.0\n.target sm_50\n.entry k(\n)\n{ ret; }")
out["no_such_entry"] = lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"installer_check")
out["release_twice"] = [lib.cuDevicePrimaryCtxRelease_v2(0),
                        lib.cuDevicePrimaryCtxRelease_v2(0)]
name = ctypes.c_char_p()
out["unnamed"] = [lib.cuGetErrorName(35, ctypes.byref(name)), name.value]
print(json.dumps(out))
"""
    env = {**os.environ, TEST_ROOT_ENV: str(root), "LD_LIBRARY_PATH": str(install_dir / "lib64")}
    answer = subprocess.run(["python3", "-c", script], env=env, capture_output=True, text=True,
                            check=True).stdout
    import json

    assert json.loads(answer) == {
        "count_before_init": 3, "init_flags": 1, "init": 0, "bad_ordinal": 101,
        "alloc_without_context": 201, "not_ptx": 218, "no_such_entry": 500,
        "release_twice": [0, 201], "unnamed": [1, None]}


def test_nvidia_real_libcuda_without_a_loaded_driver(tmp_path: Path) -> None:
    """NVIDIA's real 535.261.03 libcuda on this machine (no nvidia module loaded): cuInit
    answers CUDA_ERROR_NO_DEVICE, while the kit's NVML still answers from its test root."""
    from kit import extract_runfile, install_nvml
    from lib.realdriver import parts

    real = parts().directory / f"libcuda.so.{parts().version}"
    install = install_nvml(extract_runfile(VERSION, tmp_path / "run"), tmp_path / "install",
                           VERSION)
    lib64 = install / "lib64"
    (lib64 / f"libcuda.so.{VERSION}").unlink()
    (lib64 / "libcuda.so.1").unlink()
    shutil.copy2(real, lib64 / real.name)
    (lib64 / "libcuda.so.1").symlink_to(real.name)

    report = check(install, node(tmp_path / "host"))

    assert report.problems[-1] == (
        "CUDA cuInit failed: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected: "
        "CUDA finds no usable GPU: the nvidia module sees none, device nodes (/dev/nvidia*) are "
        "missing or not accessible, or every GPU is in MIG mode without instances")
    assert report.to_json()["cuda"]["library"] == str(lib64 / real.name)
    with pytest.raises(VerificationFailed, match="CUDA_ERROR_NO_DEVICE"):
        require_ok(report)
