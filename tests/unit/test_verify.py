"""installer.verify against canned answers in the real tools' formats (no driver, no GPU)."""

from __future__ import annotations

import ctypes
import json
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pynvml
import pytest

import installer
from installer import verify as verify_mod
from installer.errors import CommandFailed, CommandNotFound, VerificationFailed
from installer.runner import Result
from installer.verify import (
    VerifyReport,
    normalize_bus_id,
    parse_smi_csv,
    require_ok,
    verify,
)

VERSION = "550.54.15"
GPUS = ("0000:3b:00.0", "0000:5e:00.0")
UUIDS = (
    "GPU-3f2a9c1e-5b7d-4e8f-a1c2-0d9e8f7a6b5c",
    "GPU-8c7b6a59-4e3d-2c1b-0a9f-8e7d6c5b4a39",
)
NAME = "NVIDIA A100-SXM4-80GB"
CLUSTER = uuid.UUID("5f2c7a1e-0b8d-4c3e-9a51-7d2e6f4b8c90")
# `nvidia-smi --query-gpu=driver_version,name,uuid,pci.bus_id,memory.total
#  --format=csv,noheader,nounits` on a two-GPU host.
SMI_OK = (
    f"{VERSION}, {NAME}, {UUIDS[0]}, 00000000:3B:00.0, 81920\n"
    f"{VERSION}, {NAME}, {UUIDS[1]}, 00000000:5E:00.0, 81920\n"
)
SMI_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)


def nvml_answer(
    version: str = VERSION,
    gpus: Sequence[tuple[str, str, str, int]] = (
        (NAME, UUIDS[0], "00000000:3B:00.0", 81920),
        (NAME, UUIDS[1], "00000000:5E:00.0", 81920),
    ),
    library: Optional[str] = None,
    error: Optional[dict[str, str]] = None,
) -> str:
    """What `python -m installer.verify` prints (the child's own JSON line)."""
    return json.dumps(
        {
            "driver_version": None if error else version,
            "gpus": []
            if error
            else [
                {
                    "index": i,
                    "name": name,
                    "uuid": uuid,
                    "pci_bus_id": bus,
                    "memory_total_mib": mib,
                    "error": None,
                }
                for i, (name, uuid, bus, mib) in enumerate(gpus)
            ],
            "library": library,
            "error": error,
        }
    )


def cuda_answer(buses: Sequence[str] = ("0000:3B:00.0", "0000:5E:00.0"),
                library: Optional[str] = None) -> str:
    """What `python -m installer.verify cuda` prints when the kernel ran on every GPU."""
    return json.dumps({"library": library, "driver_version": 12040, "error": None, "devices": [
        {"ordinal": i, "name": NAME, "pci_bus_id": bus, "ok": True, "error": None}
        for i, bus in enumerate(buses)]})


@dataclass
class Call:
    argv: tuple[str, ...]
    check: bool
    timeout: Optional[float]
    env: Optional[dict[str, str]]
    cwd: Optional[str]


@dataclass
class FakeRunner:
    """Answers by program: argv[0] ending in nvidia-smi, or the python child (NVML, or CUDA
    with its `cuda` argument: by default the kernel ran on both GPUs)."""

    smi: Any = None
    nvml: Any = None
    cuda: Any = (0, cuda_answer())
    calls: list[Call] = field(default_factory=list)

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stream: bool = False,
        input_text: Optional[str] = None,
    ) -> Result:
        args = tuple(argv)
        self.calls.append(Call(args, check, timeout, dict(env) if env else None, cwd))
        answer = self.smi if args[0].endswith("/nvidia-smi") else self.nvml
        if args[-1] == "cuda":
            answer = self.cuda
        if isinstance(answer, BaseException):
            raise answer
        if answer is None:
            raise AssertionError(f"unexpected command: {args}")
        returncode, output = answer
        return Result(args, returncode, output)


@pytest.fixture
def install_dir(tmp_path: Path) -> Path:
    """An install dir as nvidia-installer + ldconfig leave it."""
    lib64 = tmp_path / "install" / "lib64"
    lib64.mkdir(parents=True)
    (lib64 / f"libnvidia-ml.so.{VERSION}").write_bytes(b"\x7fELF")
    (lib64 / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{VERSION}")
    return tmp_path / "install"


def ok_runner(install_dir: Path, **overrides: Any) -> FakeRunner:
    lib = str(install_dir / "lib64" / f"libnvidia-ml.so.{VERSION}")
    runner = FakeRunner(smi=(0, SMI_OK), nvml=(0, nvml_answer(library=lib) + "\n"))
    for name, value in overrides.items():
        setattr(runner, name, value)
    return runner


def run_verify(
    install_dir: Path, runner: FakeRunner, version: Optional[str] = VERSION, gpus: Any = GPUS
) -> VerifyReport:
    return verify(
        install_dir=install_dir,
        expected_version=version,
        expected_gpus=gpus,
        runner=runner,
        timeout=30,
    )


def problems_when(install_dir: Path, **answers: Any) -> tuple[str, ...]:
    """The problems verify reports when nvidia-smi or the NVML child answer so (the other as
    a good driver's does), expecting the usual version and GPUs."""
    return run_verify(install_dir, ok_runner(install_dir, **answers)).problems


# --- what we run ------------------------------------------------------------------------


def test_runs_install_dir_nvidia_smi_and_one_nvml_child_with_its_libraries(
    install_dir: Path,
) -> None:
    runner = ok_runner(install_dir)

    report = run_verify(install_dir, runner)

    assert report.ok, report.problems
    lib64 = str(install_dir / "lib64")
    smi, child, cuda_child = runner.calls
    assert smi.argv == (
        str(install_dir / "bin" / "nvidia-smi"),
        "--query-gpu=driver_version,name,uuid,pci.bus_id,memory.total",
        "--format=csv,noheader,nounits",
    )
    assert smi.env == {"LD_LIBRARY_PATH": lib64}
    assert smi.check is False
    assert smi.timeout == 30
    assert child.argv == (sys.executable, "-m", "installer.verify")
    assert child.env == {"LD_LIBRARY_PATH": lib64}
    assert child.check is False
    assert child.timeout is not None and 1 <= child.timeout <= 30
    # the child imports this very package, whether or not it is pip-installed
    assert child.cwd == str(Path(installer.__file__).resolve().parent.parent)
    assert cuda_child.argv == (sys.executable, "-m", "installer.verify", "cuda")
    assert (cuda_child.env, cuda_child.cwd, cuda_child.check) == (child.env, child.cwd, False)


def test_report_of_a_good_driver(install_dir: Path) -> None:
    report = run_verify(install_dir, ok_runner(install_dir))

    assert report.nvml_driver_version == VERSION
    assert report.smi_driver_version == VERSION
    assert [(g.index, g.name, g.uuid, g.pci_bus_id, g.memory_total_mib) for g in report.gpus] == [
        (0, NAME, UUIDS[0], "0000:3b:00.0", 81920),
        (1, NAME, UUIDS[1], "0000:5e:00.0", 81920),
    ]
    assert report.problems == ()
    require_ok(report)  # does not raise


# --- parsing ----------------------------------------------------------------------------


def test_smi_csv_names_with_spaces_and_sysfs_bus_ids() -> None:
    output = (
        "535.183.01, NVIDIA GeForce RTX 4090, GPU-aaaaaaaa-1111-2222-3333-444444444444, "
        "00000000:01:00.0, 24564\n"
        "535.183.01, Tesla T4, GPU-bbbbbbbb-1111-2222-3333-444444444444, 00000001:AF:1F.7, 15360\n"
    )

    version, gpus = parse_smi_csv(output)

    assert version == "535.183.01"
    assert [(g.name, g.pci_bus_id, g.memory_total_mib) for g in gpus] == [
        ("NVIDIA GeForce RTX 4090", "0000:01:00.0", 24564),
        ("Tesla T4", "0001:af:1f.7", 15360),
    ]


def test_smi_csv_skips_warnings_and_keeps_unknown_memory_as_none() -> None:
    output = (
        "WARNING: infoROM is corrupted at gpu 0000:3B:00.0\n"
        f"{VERSION}, {NAME}, {UUIDS[0]}, 00000000:3B:00.0, [N/A]\n"
    )

    version, gpus = parse_smi_csv(output)

    assert version == VERSION
    assert len(gpus) == 1
    assert gpus[0].memory_total_mib is None


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("0000:3B:00.0", "0000:3b:00.0"),
        (" 00000002:0a:1f.3 ", "0002:0a:1f.3"),
        ("not-a-bus-id", "not-a-bus-id"),
    ],
)
def test_normalize_bus_id(raw: str, normal: str) -> None:
    assert normalize_bus_id(raw) == normal


# --- mismatches -------------------------------------------------------------------------


def test_wrong_version_names_expected_and_actual_for_both_sources(install_dir: Path) -> None:
    report = run_verify(install_dir, ok_runner(install_dir), version="550.90.07")

    assert not report.ok
    assert report.problems == (
        "NVML reports driver 550.54.15, expected 550.90.07",
        "nvidia-smi reports driver 550.54.15, expected 550.90.07",
    )
    with pytest.raises(VerificationFailed) as raised:
        require_ok(report)
    assert "NVML reports driver 550.54.15, expected 550.90.07" in raised.value.message
    assert "nvidia-smi reports driver 550.54.15, expected 550.90.07" in raised.value.message
    assert raised.value.exit_code == VerificationFailed.exit_code


def test_no_expected_version_still_catches_sources_that_disagree(install_dir: Path) -> None:
    runner = ok_runner(install_dir, smi=(0, SMI_OK.replace(VERSION, "550.54.14")))

    report = run_verify(install_dir, runner, version=None)

    assert report.problems == ("NVML reports driver 550.54.15 but nvidia-smi reports 550.54.14",)


def test_gpu_count_differs(install_dir: Path) -> None:
    one_gpu = SMI_OK.splitlines()[0] + "\n"
    lib = str(install_dir / "lib64" / f"libnvidia-ml.so.{VERSION}")
    assert problems_when(
        install_dir,
        smi=(0, one_gpu),
        nvml=(0, nvml_answer(gpus=[(NAME, UUIDS[0], "00000000:3B:00.0", 81920)], library=lib)),
    ) == (
        "NVML sees 1 GPU(s), expected 2 (0000:3b:00.0, 0000:5e:00.0)",
        "NVML does not see the expected GPU 0000:5e:00.0",
        "nvidia-smi sees 1 GPU(s), expected 2 (0000:3b:00.0, 0000:5e:00.0)",
        "nvidia-smi does not see the expected GPU 0000:5e:00.0",
    )


def test_bus_id_that_was_not_planned(install_dir: Path) -> None:
    report = run_verify(install_dir, ok_runner(install_dir), gpus=("0000:3b:00.0", "0000:af:00.0"))

    assert "NVML does not see the expected GPU 0000:af:00.0" in report.problems
    assert "NVML reports GPU 0000:5e:00.0, which is not among the expected GPUs" in report.problems
    assert "nvidia-smi does not see the expected GPU 0000:af:00.0" in report.problems
    assert not any("sees" in p for p in report.problems)  # the count itself is right


def test_expected_gpus_in_smi_form_are_normalised_too(install_dir: Path) -> None:
    report = run_verify(
        install_dir, ok_runner(install_dir), gpus=("00000000:3B:00.0", "00000000:5E:00.0")
    )

    assert report.ok, report.problems


def test_gpu_without_name_uuid_or_memory(install_dir: Path) -> None:
    lib = str(install_dir / "lib64" / f"libnvidia-ml.so.{VERSION}")
    assert problems_when(
        install_dir,
        nvml=(
            0,
            nvml_answer(
                gpus=[
                    (NAME, UUIDS[0], "00000000:3B:00.0", 81920),
                    ("", "", "00000000:5E:00.0", 0),
                ],
                library=lib,
            ),
        ),
    ) == (
        "NVML GPU 1 (0000:5e:00.0) has no name",
        "NVML GPU 1 (0000:5e:00.0) has no UUID",
        "NVML GPU 1 (0000:5e:00.0) reports memory 0, expected > 0 MiB",
    )


def test_uuid_differs_between_nvml_and_smi(install_dir: Path) -> None:
    assert problems_when(install_dir, smi=(0, SMI_OK.replace(UUIDS[1], "GPU-other"))) == (
        f"GPU 0000:5e:00.0 has UUID {UUIDS[1]} in NVML but GPU-other in nvidia-smi",
    )


# --- failures to answer -----------------------------------------------------------------


def test_smi_exit_9_is_no_driver(install_dir: Path) -> None:
    runner = ok_runner(install_dir, smi=(9, SMI_NO_DRIVER))

    report = run_verify(install_dir, runner)

    assert report.problems == ("nvidia-smi could not communicate with the driver (exit 9)",)
    assert report.smi_driver_version is None
    assert report.gpus[0].uuid == UUIDS[0]  # NVML's answer still reported


# One answer of nvidia-smi or of the NVML child (the other answering as a good driver's does)
# and the one problem verify makes of it.
@pytest.mark.parametrize(("answers", "problem"), [
    pytest.param(
        {"smi": (12, "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please "
                 "make sure that the NVIDIA Display Driver is properly installed and present "
                 "in your system.\nPlease also try adding directory that contains "
                 "libnvidia-ml.so to your system PATH.\n")},
        "nvidia-smi could not load libnvidia-ml.so.1 (exit 12)", id="smi-exit-12-no-library"),
    pytest.param(
        {"smi": (6, "No devices were found\n")},
        "nvidia-smi found no GPUs (exit 6), expected 2 (0000:3b:00.0, 0000:5e:00.0)",
        id="smi-no-devices-when-gpus-were-expected"),
    pytest.param(
        {"smi": (2, 'Field "memory.totl" is not a valid field to query.\n')},
        'nvidia-smi failed with exit 2: Field "memory.totl" is not a valid field to query.',
        id="smi-other-exit-its-last-line"),
    pytest.param(
        {"smi": (0, "something unexpected\n")},
        "nvidia-smi printed no GPU rows: something unexpected", id="smi-exit-0-without-rows"),
    pytest.param(
        {"nvml": (0, '{"driver_version": null, "error": null}')},
        'the NVML check answered without a driver version: {"driver_version": null, '
        '"error": null}', id="nvml-answer-without-version"),
    pytest.param(
        {"nvml": (-11, "Fatal Python error: Segmentation fault\n")},
        "the NVML check (python -m installer.verify) exited -11 without an answer: "
        "Fatal Python error: Segmentation fault", id="nvml-child-crashes-without-json"),
])
def test_an_answer_that_is_one_problem(
    install_dir: Path, answers: dict[str, Any], problem: str
) -> None:
    assert problems_when(install_dir, **answers) == (problem,)


def test_no_gpus_planned_and_none_found_is_ok(install_dir: Path) -> None:
    lib = str(install_dir / "lib64" / f"libnvidia-ml.so.{VERSION}")
    runner = ok_runner(
        install_dir,
        smi=(6, "No devices were found\n"),
        nvml=(0, nvml_answer(gpus=[], library=lib)),
    )

    report = run_verify(install_dir, runner, gpus=())

    assert report.problems == ()
    assert report.nvml_driver_version == VERSION


def test_smi_missing(install_dir: Path) -> None:
    smi_path = install_dir / "bin" / "nvidia-smi"
    assert problems_when(install_dir, smi=CommandNotFound(f"command not found: {smi_path}")) == (
        f"nvidia-smi is missing: {smi_path} does not exist",
    )


def test_smi_timeout(install_dir: Path) -> None:
    smi_path = str(install_dir / "bin" / "nvidia-smi")
    assert problems_when(
        install_dir,
        smi=CommandFailed(
            [smi_path], -9, "", message=f"`{smi_path}` did not finish within 30 s and was killed"
        ),
    ) == (
        f"nvidia-smi did not answer: `{smi_path}` did not finish within 30 s and was killed",
    )


def test_nvml_driver_not_loaded(install_dir: Path) -> None:
    error = {
        "call": "nvmlInit",
        "type": "NVMLError_DriverNotLoaded",
        "message": "Driver Not Loaded",
    }
    runner = ok_runner(install_dir, smi=(9, SMI_NO_DRIVER), nvml=(0, nvml_answer(error=error)))

    report = run_verify(install_dir, runner)

    assert report.problems == (
        "nvidia-smi could not communicate with the driver (exit 9)",
        "NVML nvmlInit failed: NVMLError_DriverNotLoaded: Driver Not Loaded",
    )
    assert report.nvml_driver_version is None
    assert report.gpus == ()


def test_nvml_per_gpu_error_is_reported(install_dir: Path) -> None:
    lib = str(install_dir / "lib64" / f"libnvidia-ml.so.{VERSION}")
    answer = json.loads(nvml_answer(library=lib))
    answer["gpus"][1].update(
        uuid=None,
        memory_total_mib=None,
        error={
            "call": "nvmlDeviceGetUUID",
            "type": "NVMLError_GpuIsLost",
            "message": "GPU is lost",
        },
    )
    runner = ok_runner(install_dir, nvml=(0, json.dumps(answer)))

    report = run_verify(install_dir, runner)

    assert report.problems[0] == (
        "NVML nvmlDeviceGetUUID failed for GPU 1: NVMLError_GpuIsLost: GPU is lost"
    )
    assert "NVML GPU 1 (0000:5e:00.0) has no UUID" in report.problems


def test_nvml_json_found_after_library_noise_on_stderr(install_dir: Path) -> None:
    lib = str(install_dir / "lib64" / f"libnvidia-ml.so.{VERSION}")
    noisy = "nvml: some warning on stderr\n" + nvml_answer(library=lib) + "\n"

    report = run_verify(install_dir, ok_runner(install_dir, nvml=(0, noisy)))

    assert report.ok, report.problems


def test_nvml_answering_from_another_library_is_a_problem(install_dir: Path) -> None:
    stale = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.183.01"
    assert problems_when(install_dir, nvml=(0, nvml_answer(library=stale))) == (
        f"NVML answered from {stale}, not from the installed {install_dir / 'lib64'}",
    )


def test_missing_soname_link_is_explained_and_nvml_not_asked(install_dir: Path) -> None:
    lib64 = install_dir / "lib64"
    (lib64 / "libnvidia-ml.so.1").unlink()
    runner = ok_runner(install_dir)

    report = run_verify(install_dir, runner)

    assert [c.argv[0] for c in runner.calls] == [str(install_dir / "bin" / "nvidia-smi")]
    assert report.problems == (
        f"{lib64 / 'libnvidia-ml.so.1'} is missing but libnvidia-ml.so.{VERSION} is there: the "
        f"soname link comes from ldconfig (`ldconfig -n {lib64}` or the ld cache step); "
        "NVML was not asked",
    )
    assert report.gpus[0].uuid == UUIDS[0]  # from nvidia-smi


def test_no_nvml_library_at_all(tmp_path: Path) -> None:
    install_dir = tmp_path / "install"
    runner = ok_runner(install_dir)

    report = run_verify(install_dir, runner)

    assert report.problems == (
        "NVML is not installed: no libnvidia-ml.so.1 (nor libnvidia-ml.so.<version>) in "
        f"{install_dir / 'lib64'}",
    )


# --- the report -------------------------------------------------------------------------


def gpu_json_of_a_good_answer(index: int, bus_id: str) -> dict[str, Any]:
    """GPU `index` in the report's JSON when NVML and nvidia-smi answered as ok_runner's do."""
    return {
        "index": index,
        "name": NAME,
        "uuid": UUIDS[index],
        "pci_bus_id": bus_id,
        "memory_total_mib": 81920,
        "fabric": {"state": None, "status": None, "cluster_uuid": None,
                   "clique_id": None, "health_mask": None, "health_summary": None},
        "persistence_mode": None,
        "cuda": {"ok": True, "error": None, "name": None, "meaning": None},
    }


def test_json_shape(install_dir: Path) -> None:
    report = run_verify(install_dir, ok_runner(install_dir), version="550.90.07")

    document = report.to_json()

    assert document == {
        "ok": False,
        "architecture": None,
        "expected_version": "550.90.07",
        "expected_gpus": list(GPUS),
        "driver_version": {"nvml": VERSION, "nvidia_smi": VERSION},
        "nvml_library": str(install_dir / "lib64" / f"libnvidia-ml.so.{VERSION}"),
        "gpus": [gpu_json_of_a_good_answer(0, "0000:3b:00.0"),
                 gpu_json_of_a_good_answer(1, "0000:5e:00.0")],
        "cuda": {"library": None, "ok": True, "failure_expected": False, "error": None},
        "fabric": {"required": False, "state": "not-applicable", "nvswitches": [],
                   "clique": None, "reasons": []},
        "coherent_memory": None,
        "problems": [
            "NVML reports driver 550.54.15, expected 550.90.07",
            "nvidia-smi reports driver 550.54.15, expected 550.90.07",
        ],
    }
    assert json.loads(json.dumps(document)) == document


def test_summary_lines(install_dir: Path) -> None:
    good = run_verify(install_dir, ok_runner(install_dir))
    bad = run_verify(install_dir, ok_runner(install_dir), version="550.90.07")

    assert good.summary_lines() == [
        f"GPU 0: {NAME} 0000:3b:00.0 {UUIDS[0]} 81920 MiB",
        f"GPU 1: {NAME} 0000:5e:00.0 {UUIDS[1]} 81920 MiB",
        f"OK: driver {VERSION} answers through NVML and nvidia-smi with 2 GPU(s) as planned, "
        "and runs a CUDA kernel on each",
    ]
    assert bad.summary_lines()[2:] == [
        "problem: NVML reports driver 550.54.15, expected 550.90.07",
        "problem: nvidia-smi reports driver 550.54.15, expected 550.90.07",
    ]


def test_report_is_frozen(install_dir: Path) -> None:
    report = run_verify(install_dir, ok_runner(install_dir))
    with pytest.raises(AttributeError):
        report.problems = ()  # type: ignore[misc]


# --- the child's NVML query, in-process, with real pynvml and its real error classes -----


def _raise(code: int) -> Callable[..., Any]:
    def fail(*args: Any) -> Any:
        raise pynvml.NVMLError(code)

    return fail


def test_child_reports_nvml_error_by_class_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", _raise(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))

    answer = verify_mod.nvml_query()

    assert answer == {
        "driver_version": None,
        "gpus": [],
        "library": None,
        "error": {
            "call": "nvmlInit",
            "type": "NVMLError_DriverNotLoaded",
            "message": "Driver Not Loaded",
        },
    }


def test_child_queries_every_device(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    buses = [b"00000000:3B:00.0", b"00000000:5E:00.0"]

    def pci(handle: int) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = buses[handle]
        return info

    def memory(handle: int) -> Any:
        return pynvml.c_nvmlMemory_t(total=81920 * 1024 * 1024, free=0, used=0)

    def fabric(handle: int, info: Any) -> int:
        # The versioned call gets nvml.h's v3 struct (pynvml's layout), by reference.
        assert info._obj.version == pynvml.nvmlGpuFabricInfo_v3
        assert ctypes.sizeof(info._obj) == ctypes.sizeof(pynvml.c_nvmlGpuFabricInfo_v3_t)
        info._obj.state = [pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
                           pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS][handle]
        info._obj.status = 0
        if handle == 0:
            info._obj.clusterUuid[:] = list(CLUSTER.bytes)
            info._obj.cliqueId = 7
            info._obj.healthMask = 2 << 12  # partition assigned: false
            info._obj.healthSummary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
        return 0

    fakes: dict[str, Callable[..., Any]] = {
        "nvmlInit": lambda: calls.append("init"),
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlSystemGetDriverVersion": lambda: VERSION,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: NAME,
        "nvmlDeviceGetUUID": lambda h: UUIDS[h],
        "nvmlDeviceGetPciInfo": pci,
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetGpuFabricInfoV": fabric,
        "nvmlDeviceGetPersistenceMode": lambda h: [pynvml.NVML_FEATURE_ENABLED,
                                                   pynvml.NVML_FEATURE_DISABLED][h],
        # [current, pending], as pynvml returns them
        "nvmlDeviceGetMigMode": lambda h: [[pynvml.NVML_DEVICE_MIG_ENABLE] * 2,
                                           [pynvml.NVML_DEVICE_MIG_DISABLE] * 2][h],
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(pynvml, name, fake)

    answer = verify_mod.nvml_query()

    assert calls == ["init", "shutdown"]
    assert answer["error"] is None
    assert answer["driver_version"] == VERSION
    assert answer["gpus"] == [
        {
            "index": 0,
            "name": NAME,
            "uuid": UUIDS[0],
            "pci_bus_id": "00000000:3B:00.0",
            "memory_total_mib": 81920,
            "error": None,
            "fabric": {"state": "completed", "status": "success",
                       "cluster_uuid": str(CLUSTER), "clique_id": 7,
                       "health_mask": 0x2000, "health_summary": "healthy",
                       "call": "nvmlDeviceGetGpuFabricInfoV"},
            "persistence_mode": "enabled",
            "mig_mode": "enabled",
        },
        {
            "index": 1,
            "name": NAME,
            "uuid": UUIDS[1],
            "pci_bus_id": "00000000:5E:00.0",
            "memory_total_mib": 81920,
            "error": None,
            "fabric": {"state": "in-progress", "status": "success",
                       "cluster_uuid": None, "clique_id": 0, "health_mask": 0,
                       "health_summary": "not-supported",
                       "call": "nvmlDeviceGetGpuFabricInfoV"},
            "persistence_mode": "disabled",
            "mig_mode": "disabled",
        },
    ]


def test_child_per_device_error_keeps_going(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: VERSION)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", _raise(pynvml.NVML_ERROR_NO_PERMISSION))

    answer = verify_mod.nvml_query()

    assert answer["error"] is None
    assert answer["gpus"][0]["error"] == {
        "call": "nvmlDeviceGetName",
        "type": "NVMLError_NoPermission",
        "message": "Insufficient Permissions",
    }


def test_child_prints_one_json_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", _raise(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))

    assert verify_mod.main() == 0

    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert json.loads(out)["error"]["type"] == "NVMLError_LibraryNotFound"
