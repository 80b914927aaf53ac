"""The CUDA check's reading of its child and its problems (canned child answers), and the child's
calls into libcuda through a stand-in library object (no GPU, no libcuda)."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any, Optional

import pytest

from installer.runner import Result
from installer.verify import cuda, cuda_child
from installer.verify.report import GpuInfo

BUSES = ("0000:3b:00.0", "0000:5e:00.0")


def gpus(mig: Optional[str] = None) -> list[GpuInfo]:
    return [GpuInfo(i, "NVIDIA H100 80GB HBM3", f"GPU-{i}", bus, 81920, mig_mode=mig)
            for i, bus in enumerate(BUSES)]


class Runner:
    def __init__(self, returncode: int, output: str) -> None:
        self.answer = (returncode, output)
        self.argv: list[str] = []

    def run(self, argv: Any, **options: Any) -> Result:
        self.argv = list(argv)
        return Result(tuple(argv), *self.answer)


def error(call: str, code: int, name: str, text: str) -> dict[str, Any]:
    return {"call": call, "code": code, "name": name, "text": text}


def ask(answer: dict[str, Any], lib_dir: Path, *, mig: Optional[str] = None,
        fabric_starts_later: bool = False) -> tuple[cuda.CudaCheck, list[str]]:
    problems: list[str] = []
    check = cuda.query({}, Runner(0, json.dumps(answer)), 10, "/", problems)
    assert check is not None and problems == []
    return cuda.check_problems(check, gpus(mig), lib_dir, fabric_starts_later)


def answer(lib_dir: Path, devices: Any = None, err: Any = None) -> dict[str, Any]:
    if devices is None:
        devices = [{"ordinal": i, "pci_bus_id": bus.upper(), "error": None}
                   for i, bus in enumerate(BUSES)]
    return {"library": str(lib_dir / "libcuda.so.550.54.15"), "devices": devices, "error": err}


def test_every_gpu_ran_the_kernel(tmp_path: Path) -> None:
    check, problems = ask(answer(tmp_path), tmp_path)
    assert problems == [] and check.passed
    assert check.for_gpu(BUSES[1]) == {"ok": True, "error": None, "name": None, "meaning": None}
    assert check.summary() is None


def test_802_is_a_problem_unless_fabric_manager_starts_later(tmp_path: Path) -> None:
    raw = answer(tmp_path, devices=[], err=error("cuInit", 802, "CUDA_ERROR_SYSTEM_NOT_READY",
                                                   "system not yet initialized"))
    _, problems = ask(raw, tmp_path)
    assert problems == [
        "CUDA cuInit failed: CUDA_ERROR_SYSTEM_NOT_READY (802): system not yet initialized: "
        + cuda.MEANINGS[802]]

    check, problems = ask(raw, tmp_path, fabric_starts_later=True)
    assert problems == [] and check.tolerated and not check.passed
    assert check.summary() == (
        "CUDA: cuInit failed: CUDA_ERROR_SYSTEM_NOT_READY (802): system not yet initialized: "
        + cuda.MEANINGS[802] + " (expected until Fabric Manager has run)")
    assert check.to_json()["failure_expected"] is True


def test_other_errors_are_problems_even_while_the_fabric_waits(tmp_path: Path) -> None:
    raw = answer(tmp_path, devices=[], err=error("cuInit", 999, "CUDA_ERROR_UNKNOWN",
                                                   "unknown error"))
    _, problems = ask(raw, tmp_path, fabric_starts_later=True)
    assert problems == ["CUDA cuInit failed: CUDA_ERROR_UNKNOWN (999): unknown error: "
                        + cuda.MEANINGS[999]]


def test_mig_gpus_without_instances_are_not_problems(tmp_path: Path) -> None:
    raw = answer(tmp_path, devices=[], err=error("cuInit", 100, "CUDA_ERROR_NO_DEVICE",
                                                   "no CUDA-capable device is detected"))
    check, problems = ask(raw, tmp_path, mig="enabled")
    assert problems == [] and check.tolerated
    assert check.summary() is not None and "MIG mode" in check.summary()  # type: ignore[operator]

    _, problems = ask(raw, tmp_path, mig="disabled")
    assert problems[0].startswith("CUDA cuInit failed: CUDA_ERROR_NO_DEVICE (100)")

    one = answer(tmp_path, devices=[{"ordinal": 0, "pci_bus_id": BUSES[0], "error": None}])
    _, problems = ask(one, tmp_path)
    assert problems == [f"GPU 1 ({BUSES[1]}): CUDA does not enumerate it, though NVML does"]
    _, problems = ask(one, tmp_path, mig="enabled")
    assert problems == []


def test_a_failing_gpu_is_named_with_its_call(tmp_path: Path) -> None:
    devices = [{"ordinal": 0, "pci_bus_id": BUSES[0], "error": None},
               {"ordinal": 1, "pci_bus_id": BUSES[1],
                "error": error("cuCtxSynchronize", 700, "CUDA_ERROR_ILLEGAL_ADDRESS",
                               "an illegal memory access was encountered")}]
    check, problems = ask(answer(tmp_path, devices=devices), tmp_path)
    assert problems == [
        f"CUDA on GPU {BUSES[1]}: cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700): an "
        f"illegal memory access was encountered: {cuda.MEANINGS[700]}"]
    assert check.for_gpu(BUSES[1])["name"] == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert check.for_gpu(BUSES[0])["ok"] is True


def test_a_code_without_a_name_or_meaning_is_still_reported(tmp_path: Path) -> None:
    raw = answer(tmp_path, devices=[], err=error("cuInit", 12345, None, None))  # type: ignore[arg-type]
    _, problems = ask(raw, tmp_path)
    assert problems == ["CUDA cuInit failed: CUresult (12345)"]


def test_a_stale_libcuda_elsewhere_is_a_problem(tmp_path: Path) -> None:
    raw = answer(tmp_path)
    raw["library"] = "/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03"
    _, problems = ask(raw, tmp_path)
    assert problems == ["CUDA answered from /usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03, "
                        f"not from the installed {tmp_path}"]


def test_a_child_that_crashes_is_a_problem() -> None:
    problems: list[str] = []
    runner = Runner(-11, "")
    assert cuda.query({"LD_LIBRARY_PATH": "/x"}, runner, 10, "/", problems) is None
    assert runner.argv[-3:] == ["-m", "installer.verify", "cuda"]
    assert problems == ["the CUDA check (python -m installer.verify cuda) exited -11 without an "
                        "answer: (no output)"]


class FakeLibcuda:
    """Records the driver API calls; `fail` makes one of them return a CUresult."""

    def __init__(self, fail: Optional[tuple[str, int]] = None) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.memory: dict[int, Any] = {}

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> int:
            self.calls.append(name)
            if self.fail and self.fail[0] == name:
                return self.fail[1]
            if name == "cuDeviceGetCount":
                args[0]._obj.value = 1
            elif name == "cuLaunchKernel":
                self.launched = args[9]
            elif name == "cuMemcpyDtoH_v2":
                a = ctypes.cast(self.launched[1], ctypes.POINTER(ctypes.c_uint32))[0]
                b = ctypes.cast(self.launched[2], ctypes.POINTER(ctypes.c_uint32))[0]
                for i in range(cuda_child.ELEMENTS):
                    args[0][i] = a * i + b
            elif name in ("cuGetErrorName", "cuGetErrorString"):
                args[1]._obj.value = f"{name}-{args[0].value}".encode()
            return 0
        return call


def child(monkeypatch: pytest.MonkeyPatch, lib: FakeLibcuda) -> dict[str, Any]:
    monkeypatch.setattr(ctypes, "CDLL", lambda name: lib)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    answer = cuda_child.cuda_check()
    import os

    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # no caller's mask hides a GPU
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert os.environ["CUDA_CACHE_DISABLE"] == "1"  # no JIT cache in the host's $HOME
    return answer


def test_the_child_runs_the_whole_sequence_and_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = FakeLibcuda()
    answer = child(monkeypatch, lib)
    assert answer["error"] is None and answer["devices"][0]["ok"] is True
    assert lib.calls == [
        "cuDriverGetVersion", "cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
        "cuDeviceGetPCIBusId", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
        "cuModuleLoadData", "cuModuleGetFunction", "cuMemAlloc_v2", "cuLaunchKernel",
        "cuCtxSynchronize", "cuMemcpyDtoH_v2", "cuMemFree_v2", "cuModuleUnload",
        "cuCtxSetCurrent", "cuDevicePrimaryCtxRelease_v2"]


def test_the_child_names_a_failed_call_and_still_releases(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lib = FakeLibcuda(fail=("cuModuleGetFunction", 500))
    answer = child(monkeypatch, lib)
    assert answer["devices"][0]["error"] == {
        "call": "cuModuleGetFunction", "code": 500, "name": "cuGetErrorName-500",
        "text": "cuGetErrorString-500"}
    assert lib.calls[lib.calls.index("cuModuleGetFunction"):] == [
        "cuModuleGetFunction", "cuModuleUnload", "cuGetErrorName", "cuGetErrorString",
        "cuCtxSetCurrent", "cuDevicePrimaryCtxRelease_v2"]


def test_the_child_reports_a_failed_init(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = child(monkeypatch, FakeLibcuda(fail=("cuInit", 100)))
    assert answer["devices"] == []
    assert answer["error"]["call"] == "cuInit" and answer["error"]["code"] == 100


def test_the_ptx_declares_the_entry_the_child_asks_for() -> None:
    text = cuda_child.PTX.decode()
    assert f".visible .entry {cuda_child.KERNEL}(" in text
    assert ".version 6.0" in text and ".target sm_50" in text


@pytest.mark.parametrize("nvswitch_node", [True, False])
def test_the_install_step_expects_802_only_where_fabric_manager_starts_later(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nvswitch_node: bool) -> None:
    """`installer run` verifies before the long-running container starts Fabric Manager."""
    from types import SimpleNamespace

    from installer import components, steps
    from installer import verify as verify_room
    from installer.hostroot import HostRoot
    from installer.verify.report import VerifyReport

    asked: dict[str, Any] = {}

    def fake_verify(**options: Any) -> VerifyReport:
        asked.update(options)
        return VerifyReport("580.105.08", (), "580.105.08", "580.105.08", (), ())

    monkeypatch.setattr(verify_room, "verify", fake_verify)
    monkeypatch.setattr(components, "fabric_required",
                        lambda root: (nvswitch_node, ("0000:05:00.0",) if nvswitch_node else ()))
    target = SimpleNamespace(version="580.105.08", flavour="open", kernel="6.1.0-56-amd64",
                             gpu_addresses=("0000:18:00.0",))
    layout = SimpleNamespace(install_local=tmp_path / "install", install_host="/install")
    ctx = SimpleNamespace(target=target, layout=layout, runner=object(),
                          root=HostRoot(tmp_path / "host"))

    steps.verify_step(ctx).apply()  # type: ignore[arg-type]

    assert asked["fabric_starts_later"] is nvswitch_node
