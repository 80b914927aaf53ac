"""The kit's nvidia-installer settles the kernel source and output paths as NVIDIA's does
(kernel.c: determine_kernel_source_path / determine_kernel_output_path) and builds with the
package's own Makefile (`make -k -jN NV_EXCLUDE_KERNEL_MODULES=... SYSSRC=... SYSOUT=...`),
against this machine's real Debian headers (split into -common and -amd64)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from shutil import which

import kit
import pytest
from lib.hostkit import debian_headers

VERSION = "550.54.15"
# This machine's Debian headers (linux-headers-amd64: 6.1.0-56-amd64 when written).
K = (debian_headers() or ("6.1.0-56-amd64", ()))[0]
AMD64 = f"/usr/src/linux-headers-{K}"
COMMON = f"/usr/src/linux-headers-{K.removesuffix('-amd64')}-common"
INSTALL_YOUR_KERNEL_SOURCE = (
    "Please make sure you have installed the kernel source files for your kernel and that they "
    "are properly configured; on Red Hat Linux systems, for example, be sure you have the "
    "'kernel-source' or 'kernel-devel' RPM installed.  If you know the correct kernel source "
    "files are installed, you may specify the kernel source path with the '--kernel-source-path' "
    "command line option."
)

pytestmark = pytest.mark.skipif(
    not Path(f"/lib/modules/{K}/source").is_dir(),
    reason=f"needs Debian's linux-headers-{K} (scripts/install-deps installs it)")


@pytest.fixture(scope="module")
def payload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runfile = kit.build_runfile(VERSION, tmp_path_factory.mktemp("run"))
    target = tmp_path_factory.mktemp("extracted") / "pkg"
    subprocess.run([str(runfile), "-x", "--target", str(target)], check=True,
                   capture_output=True)
    return target


def install(payload: Path, tmp_path: Path, *flags: str,
            env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    """A modules-only install into tmp_path; returns the result and the installer's log."""
    log = tmp_path / "nvidia-installer.log"
    argv = [str(payload / "nvidia-installer"), "-s", "-K", "--skip-depmod", "--skip-module-load",
            f"-k{K}", "-j2", f"--kernel-install-path={tmp_path}/modules",
            # the kernel-module pass writes the GSP firmware: never into this machine's
            f"--override-file-type-destination=FIRMWARE:{tmp_path}/firmware",
            f"--log-file-name={log}", *flags]
    clean = {k: v for k, v in os.environ.items() if k not in ("SYSSRC", "SYSOUT")}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                            env={**clean, **(env or {})})
    return result, log.read_text() if log.is_file() else ""


def built(tmp_path: Path) -> list[str]:
    modules = tmp_path / "modules"
    return sorted(p.name for p in modules.iterdir()) if modules.is_dir() else []


def test_default_source_is_lib_modules_source_and_output_is_build(
    payload: Path, tmp_path: Path
) -> None:
    result, log = install(payload, tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"Kernel source path: '/lib/modules/{K}/source'" in log
    assert f"Kernel output path: '/lib/modules/{K}/build'" in log
    # NVIDIA's Makefile hands kbuild the source tree and the output tree as KBUILD_OUTPUT.
    assert f"Entering directory '{AMD64}'" in log
    assert built(tmp_path) == ["nvidia-drm.ko", "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]
    vermagic = subprocess.run(["modinfo", "-F", "vermagic", str(tmp_path / "modules/nvidia.ko")],
                              capture_output=True, text=True, check=True).stdout
    assert vermagic.startswith(f"{K} ")


def test_the_output_tree_as_source_path_fails_the_kernel_h_check(
    payload: Path, tmp_path: Path
) -> None:
    """What the installer once passed on Debian (the output tree as the source path): exit 1
    and NVIDIA's message."""
    result, _ = install(payload, tmp_path, f"--kernel-source-path={AMD64}")
    assert result.returncode == 1
    assert (
        f"ERROR: The kernel header file '{AMD64}/include/linux/kernel.h' does not exist.  The "
        f"most likely reason for this is that the kernel source path '{AMD64}' is incorrect.  "
        f"{INSTALL_YOUR_KERNEL_SOURCE}") in result.stderr
    assert built(tmp_path) == []


def test_a_given_source_path_is_also_the_output_path(payload: Path, tmp_path: Path) -> None:
    """-common alone: the output defaults to the source path, which is not configured."""
    result, _ = install(payload, tmp_path, f"--kernel-source-path={COMMON}")
    assert result.returncode == 1
    assert (
        f"ERROR: Neither the '{COMMON}/include/linux/version.h' nor the "
        f"'{COMMON}/include/generated/uapi/linux/version.h' kernel header file exists. The most "
        f"likely reason for this is that the kernel source files in '{COMMON}' have not been "
        "configured.") in result.stderr


def test_both_paths_build_and_reach_make_as_syssrc_and_sysout(
    payload: Path, tmp_path: Path
) -> None:
    result, log = install(payload, tmp_path, f"--kernel-source-path={COMMON}",
                          f"--kernel-output-path={AMD64}", "--no-drm", "--no-unified-memory")
    assert result.returncode == 0, result.stderr
    assert f"Kernel source path: '{COMMON}'" in log and f"Kernel output path: '{AMD64}'" in log
    assert built(tmp_path) == ["nvidia-modeset.ko", "nvidia.ko"]
    assert not (payload / "kernel/nvidia-drm.ko").exists(), "make clean ran first"


def test_syssrc_and_sysout_from_the_environment(payload: Path, tmp_path: Path) -> None:
    result, log = install(payload, tmp_path, env={"SYSSRC": COMMON, "SYSOUT": AMD64})
    assert result.returncode == 0, result.stderr
    assert f"Using the kernel source path '{COMMON}', as specified by the SYSSRC environment" in log
    assert f"Kernel output path: '{AMD64}'" in log


@pytest.mark.parametrize(("flags", "message"), [
    ((f"--kernel-source-path={COMMON}", "--kernel-output-path=/nonexistent"),
     "ERROR: The kernel output path '/nonexistent' does not exist."),
    (("--kernel-source-path=/usr",),
     f"ERROR: The kernel source path '/usr' is invalid.  {INSTALL_YOUR_KERNEL_SOURCE}"),
    (("--kernel-source-path=/nonexistent",),
     f"ERROR: The kernel source path '/nonexistent' does not exist.  "
     f"{INSTALL_YOUR_KERNEL_SOURCE}"),
    (("-k", "0.0.0-no-such-kernel"),
     "ERROR: Unable to find the kernel source tree for the currently running kernel.  "
     f"{INSTALL_YOUR_KERNEL_SOURCE}"),
])
def test_bad_paths_fail_with_nvidias_messages(
    payload: Path, tmp_path: Path, flags: tuple[str, ...], message: str
) -> None:
    result, _ = install(payload, tmp_path, *flags)
    assert result.returncode == 1
    assert message in result.stderr
    assert built(tmp_path) == []


def test_left_out_modules_reach_make_in_nvidias_order(payload: Path, tmp_path: Path) -> None:
    """--no-peermem names nothing: the kit's tree has no nvidia-peermem (NVIDIA's has)."""
    result, log = install(payload, tmp_path, f"--kernel-source-path={COMMON}",
                          f"--kernel-output-path={AMD64}", "--no-unified-memory", "--no-drm",
                          "--no-peermem", "--skip-depmod")
    assert result.returncode == 0, result.stderr
    kernel_dir = payload / "kernel"
    expected = (f'cd {kernel_dir}; {which("make")} -k -j2 NV_EXCLUDE_KERNEL_MODULES="nvidia-drm '
                f'nvidia-uvm" SYSSRC="{COMMON}" SYSOUT="{AMD64}"')
    assert f"executing: '{expected} clean'..." in log
    assert f"executing: '{expected}'..." in log
    assert built(tmp_path) == ["nvidia-modeset.ko", "nvidia.ko"]


def test_a_concurrency_level_that_is_no_number_is_refused(payload: Path, tmp_path: Path) -> None:
    result, _ = install(payload, tmp_path, "--concurrency-level=x")
    assert result.returncode == 1 and "Invalid concurrency level 'x'." in result.stderr
