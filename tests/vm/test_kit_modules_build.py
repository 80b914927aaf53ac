"""The fake NVIDIA modules build with kbuild against the real kernel headers (no VM needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from vm.fake_modules import KIT_KERNEL_DIR, MODULE_FILES, build_fake_modules, make_command


def modinfo(module: Path, field: str) -> list[str]:
    result = subprocess.run(
        ["modinfo", "-F", field, str(module)], check=True, capture_output=True, text=True
    )
    return result.stdout.split("\n")[:-1]


def test_builds_all_four_modules_with_versions_and_dependencies(
    kernel_build_dir: Path, tmp_path: Path
) -> None:
    built = build_fake_modules(
        kernel_build_dir, tmp_path / "kit", version="550.54.15", flavour="proprietary"
    )

    assert sorted(p.name for p in built.glob("*.ko")) == sorted(MODULE_FILES)
    assert [modinfo(built / name, "version") for name in MODULE_FILES] == [["550.54.15"]] * 4
    assert modinfo(built / "nvidia.ko", "name") == ["nvidia"]
    assert modinfo(built / "nvidia-uvm.ko", "depends") == ["nvidia"]
    assert modinfo(built / "nvidia-modeset.ko", "depends") == ["nvidia"]
    assert modinfo(built / "nvidia-drm.ko", "depends") == ["nvidia-modeset"]
    assert modinfo(built / "nvidia.ko", "license") == ["NVIDIA"]
    assert {line.split(":")[0] for line in modinfo(built / "nvidia.ko", "parm")} == {
        "NVreg_DeviceFileUID",
        "NVreg_DeviceFileGID",
        "NVreg_DeviceFileMode",
        "NVreg_ModifyDeviceFiles",
        "NVreg_RestrictProfilingToAdminUsers",
        "NVreg_EnableGpuFirmware",
        "NVreg_OpenRmEnableUnsupportedGpus",
        # The kit's stand-in for an NVL72 rack's switch trays (tests set them; kit/fabric.py).
        "nvfake_rack_fabric_state",
        "nvfake_rack_fabric_status",
        "nvfake_rack_cluster_uuid",
        "nvfake_rack_clique_id",
    }


def test_optional_modules_can_be_left_out(kernel_build_dir: Path, tmp_path: Path) -> None:
    built = build_fake_modules(
        kernel_build_dir,
        tmp_path / "kit",
        version="580.65.06",
        flavour="open",
        NV_BUILD_UVM="0",
        NV_BUILD_DRM="0",
    )

    assert sorted(p.name for p in built.glob("*.ko")) == ["nvidia-modeset.ko", "nvidia.ko"]
    assert modinfo(built / "nvidia.ko", "license") == ["Dual MIT/GPL"]


@pytest.mark.parametrize(
    ("variables", "complaint"),
    [
        ({"NV_FLAVOUR": "open"}, "NV_VERSION must look like 550.54.15, got ''"),
        ({"NV_VERSION": "latest", "NV_FLAVOUR": "open"}, "got 'latest'"),
        ({"NV_VERSION": "550.54.15"}, "NV_FLAVOUR must be open or proprietary, got ''"),
        ({"NV_VERSION": "550.54.15", "NV_FLAVOUR": "kernel-open"}, "got 'kernel-open'"),
        (
            {"NV_VERSION": "550.54.15", "NV_FLAVOUR": "open", "NV_BUILD_MODESET": "0"},
            "nvidia-drm depends on nvidia-modeset",
        ),
    ],
)
def test_bad_build_variables_fail_the_build(
    kernel_build_dir: Path, tmp_path: Path, variables: dict[str, str], complaint: str
) -> None:
    sources = shutil.copytree(KIT_KERNEL_DIR, tmp_path / "kit")
    build = subprocess.run(
        make_command(kernel_build_dir, sources, **variables), capture_output=True, text=True
    )

    assert build.returncode != 0
    assert complaint in build.stderr
