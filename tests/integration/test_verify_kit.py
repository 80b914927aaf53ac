"""installer.verify for real: SubprocessRunner, real pynvml, the kit's fake NVML and nvidia-smi.

The fake `libnvidia-ml.so.<ver>` and `nvidia-smi` answer from `/proc/driver/nvidia` (and
`/dev/nvidiactl`, sysfs) under the kit's test-only root variable, so a crafted tree stands
for a loaded kernel module with two GPUs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from installer.errors import VerificationFailed
from installer.runner import SubprocessRunner
from installer.verify import require_ok, verify
from installer.verify.report import VerifyReport

TEST_ROOT_ENV = "NVFAKE_TEST_ROOT"  # the kit's test-only root (tests/kit/payload/native/kstate.c)

VERSION = "550.54.15"
GPUS = {
    # address: (PCI device id, model as the module prints it, UUID)
    "0000:3b:00.0": ("0x20b2", "NVIDIA A100-SXM4-80GB", "GPU-3f2a9c1e-5b7d-4e8f-a1c2-0d9e8f7a6b5c"),
    "0000:5e:00.0": ("0x20b2", "NVIDIA A100-SXM4-80GB", "GPU-8c7b6a59-4e3d-2c1b-0a9f-8e7d6c5b4a39"),
}


def _ldconfig() -> str | None:
    return shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")


def _missing_tools() -> str | None:
    # The kit compiles the libraries with gcc and packs the .run with makeself.
    for tool in ("gcc", "makeself"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (the kit needs it to build the fake driver)"
    if _ldconfig() is None:
        return "ldconfig is not installed (it makes the libnvidia-ml.so.1 soname link)"
    return None


pytestmark = pytest.mark.skipif(_missing_tools() is not None, reason=str(_missing_tools()))


@pytest.fixture(scope="module")
def extracted_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kit's NVIDIA-Linux-x86_64-<ver>.run, built and unpacked like the real one."""
    from kit import extract_runfile

    return extract_runfile(VERSION, tmp_path_factory.mktemp("runfile"))


@pytest.fixture
def install_dir(tmp_path: Path, extracted_driver: Path) -> Path:
    """`<tmp>/install` holding the driver's nvidia-smi and NVML, after `ldconfig -n`."""
    from kit import install_nvml

    install = install_nvml(extracted_driver, tmp_path / "install", VERSION)
    assert os.readlink(install / "lib64" / "libnvidia-ml.so.1") == f"libnvidia-ml.so.{VERSION}"
    return install


def loaded_driver(root: Path, version: str = VERSION) -> Path:
    """A host root where the module `version` is loaded with GPUS, as nvidia.ko shows it."""
    proc = root / "proc" / "driver" / "nvidia"
    (proc / "gpus").mkdir(parents=True)
    (proc / "version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  "
        "Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    for minor, (address, (device_id, model, uuid)) in enumerate(sorted(GPUS.items())):
        (proc / "gpus" / address).mkdir()
        (proc / "gpus" / address / "information").write_text(
            f"Model: \t\t {model}\n"
            "IRQ:   \t\t 42\n"
            f"GPU UUID: \t {uuid}\n"
            "Video BIOS: \t ??.??.??.??.??\n"
            "Bus Type: \t PCIe\n"
            "DMA Size: \t 47 bits\n"
            "DMA Mask: \t 0x7fffffffffff\n"
            f"Bus Location: \t {address}\n"
            f"Device Minor: \t {minor}\n"
            "GPU Excluded:\t No\n"
        )
        sysfs = root / "sys" / "bus" / "pci" / "devices" / address
        sysfs.mkdir(parents=True)
        (sysfs / "vendor").write_text("0x10de\n")
        (sysfs / "device").write_text(f"{device_id}\n")
    (root / "dev").mkdir()
    (root / "dev" / "nvidiactl").write_bytes(b"")  # the libraries only open() it
    for minor in range(len(GPUS)):
        (root / "dev" / f"nvidia{minor}").write_bytes(b"")  # libcuda opens each GPU's node
    return root


def runner_for(root: Path) -> SubprocessRunner:
    return SubprocessRunner(base_env={**os.environ, TEST_ROOT_ENV: str(root)})


def verify_on(root: Path, install_dir: Path) -> VerifyReport:
    """installer.verify of `install_dir` expecting VERSION on GPUS, the driver state under
    `root`."""
    return verify(install_dir=install_dir, expected_version=VERSION,
                  expected_gpus=sorted(GPUS), runner=runner_for(root))


def test_loaded_driver_with_two_gpus_passes(install_dir: Path, tmp_path: Path) -> None:
    root = loaded_driver(tmp_path / "host")

    report = verify_on(root, install_dir)

    assert report.problems == ()
    require_ok(report)
    assert report.nvml_driver_version == VERSION
    assert report.smi_driver_version == VERSION
    assert report.nvml_library == str(install_dir / "lib64" / f"libnvidia-ml.so.{VERSION}")
    assert [(g.pci_bus_id, g.name, g.uuid, g.memory_total_mib) for g in report.gpus] == [
        (address, model, uuid, 81920) for address, (_, model, uuid) in sorted(GPUS.items())
    ]
    assert report.smi_gpus == report.gpus


def test_wrong_expected_version_names_the_difference(install_dir: Path, tmp_path: Path) -> None:
    root = loaded_driver(tmp_path / "host")

    report = verify(
        install_dir=install_dir,
        expected_version="550.90.07",
        expected_gpus=sorted(GPUS),
        runner=runner_for(root),
    )

    assert report.problems == (
        f"NVML reports driver {VERSION}, expected 550.90.07",
        f"nvidia-smi reports driver {VERSION}, expected 550.90.07",
    )
    with pytest.raises(VerificationFailed, match=r"expected 550\.90\.07"):
        require_ok(report)


def test_missing_gpu_is_named(install_dir: Path, tmp_path: Path) -> None:
    root = loaded_driver(tmp_path / "host")

    report = verify(
        install_dir=install_dir,
        expected_version=VERSION,
        expected_gpus=[*sorted(GPUS), "0000:af:00.0"],
        runner=runner_for(root),
    )

    assert "NVML sees 2 GPU(s), expected 3 (0000:3b:00.0, 0000:5e:00.0, 0000:af:00.0)" in (
        report.problems
    )
    assert "nvidia-smi does not see the expected GPU 0000:af:00.0" in report.problems


def test_no_driver_state_fails_with_driver_not_loaded(install_dir: Path, tmp_path: Path) -> None:
    empty_root = tmp_path / "host"
    empty_root.mkdir()

    report = verify_on(empty_root, install_dir)

    assert report.problems == (
        "nvidia-smi could not communicate with the driver (exit 9)",
        "NVML nvmlInit failed: NVMLError_DriverNotLoaded: Driver Not Loaded",
    )
    with pytest.raises(VerificationFailed, match="NVMLError_DriverNotLoaded"):
        require_ok(report)


def test_module_of_another_version_still_loaded(install_dir: Path, tmp_path: Path) -> None:
    # An upgrade whose old module could not be unloaded: the new library refuses the old module.
    root = loaded_driver(tmp_path / "host", version="535.183.01")

    report = verify_on(root, install_dir)

    assert report.problems == (
        "nvidia-smi failed with exit 18: "
        "Failed to initialize NVML: Driver/library version mismatch",
        "NVML nvmlInit failed: NVMLError_LibRmVersionMismatch: "
        "RM has detected an NVML/RM version mismatch.",
    )


def test_missing_soname_link_is_explained(install_dir: Path, tmp_path: Path) -> None:
    root = loaded_driver(tmp_path / "host")
    lib64 = install_dir / "lib64"
    (lib64 / "libnvidia-ml.so.1").unlink()  # as nvidia-installer leaves it before ldconfig

    report = verify_on(root, install_dir)

    assert report.problems[0] == "nvidia-smi could not load libnvidia-ml.so.1 (exit 12)"
    assert report.problems[1].startswith(
        f"{lib64 / 'libnvidia-ml.so.1'} is missing but libnvidia-ml.so.{VERSION} is there"
    )
