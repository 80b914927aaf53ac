"""`installer run` with NVIDIA's real 535.261.03 driver parts (Debian's non-free packages packed
into a .run by the kit) on Debian 12 host roots with Debian's split headers, building ahead
(nothing is loaded here; that is the vm tier). Each real tree is compiled once per session and
many things are asserted on it:

- proprietary against this machine's 6.1.0-56 headers (-common as source, -amd64 as output);
- open against Debian's 6.1.0-47 headers, with NVIDIA's GSP firmware on the host;
- open against 6.1.0-56, which NVIDIA's 535.261.03 open sources do not compile for (a driver
  older than its kernel): module-build-failed quoting the compiler, the host as it was.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
from lib.hostkit import INSTALL_DIR_HOST, debian_headers, make_debian_host, tree_snapshot
from lib.marks import needs_headers
from lib.realdriver import (
    VERSION,
    RealInstall,
    assert_installed_into,
    assert_verify_found_no_driver,
    elf,
    env_for,
    install_dir,
    make_debian_host_with,
    modinfo,
    nvidias_built_modules,
    old_headers,
    parts,
    proprietary_install,
    run_installer_niced,
    runfile,
    same_bytes,
)

pytestmark = needs_headers

# This machine's Debian headers: 6.1.0-56-amd64 when written, which NVIDIA's 535.261.03 open
# sources do not compile for.
K56 = (debian_headers() or ("6.1.0-56-amd64", ()))[0]
COMMON56 = f"/usr/src/linux-headers-{K56.removesuffix('-amd64')}-common"
AMD64_56 = f"/usr/src/linux-headers-{K56}"
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


@pytest.fixture(scope="module")
def proprietary(tmp_path_factory: pytest.TempPathFactory) -> RealInstall:
    installed = proprietary_install(tmp_path_factory)
    assert installed.kernel == K56
    assert installed.result.returncode == 0, installed.result.stderr[-5000:]
    return installed


@pytest.fixture(scope="module")
def warm(proprietary: RealInstall) -> tuple[subprocess.CompletedProcess[str], int]:
    """A second run of the same plan, and nvidia.ko's mtime before it."""
    mtime = (proprietary.drivers / "nvidia.ko").stat().st_mtime_ns
    return run_installer_niced(proprietary.env, "run", timeout=600), mtime


def test_debians_split_headers_reach_nvidia_installer_as_source_and_output(
    proprietary: RealInstall,
) -> None:
    log = (proprietary.install / "nvidia-installer-build.log").read_text()
    assert f"Kernel source path: '{COMMON56}'" in log
    assert f"Kernel output path: '{AMD64_56}'" in log
    assert f'SYSSRC="{COMMON56}" SYSOUT="{AMD64_56}"' in log  # NVIDIA's Makefile got both
    stderr = proprietary.result.stderr
    assert f"plan: kernel-source-path = {COMMON56}" in stderr
    assert f"plan: kernel-output-path = {AMD64_56}" in stderr
    assert f"building ahead for {K56}" in stderr


def test_nvidia_ko_is_nvidias_535_for_the_target_kernel(proprietary: RealInstall) -> None:
    drivers = proprietary.drivers
    built = nvidias_built_modules(drivers, VERSION)
    nvidia = drivers / "nvidia.ko"
    assert modinfo(nvidia, "vermagic").startswith(f"{K56} SMP preempt mod_unload modversions")
    for module in built:
        assert modinfo(drivers / module, "vermagic").startswith(f"{K56} "), module
    assert_installed_into(proprietary.root, proprietary.root / "lib/modules", K56, nvidia)


def test_nvidias_user_space_lands_in_the_install_dir(proprietary: RealInstall) -> None:
    real = parts()
    version_dir = proprietary.install / "versions" / VERSION
    for tool in ("nvidia-smi", "nvidia-modprobe"):
        installed = version_dir / "bin" / tool
        assert elf(installed) and same_bytes(installed, real.file(tool)), tool
    assert stat.S_IMODE((version_dir / "bin/nvidia-modprobe").stat().st_mode) == 0o4755
    for library, soname in (("libnvidia-ml", "libnvidia-ml.so.1"), ("libcuda", "libcuda.so.1")):
        installed = version_dir / "lib64" / f"{library}.so.{VERSION}"
        assert same_bytes(installed, real.file(installed.name)), library
        assert os.readlink(version_dir / "lib64" / soname) == installed.name
    for name in FIRMWARE:
        host_copy = proprietary.root / "lib/firmware/nvidia" / VERSION / name
        assert same_bytes(host_copy, real.firmware / name)
        assert stat.S_IMODE(host_copy.stat().st_mode) == 0o644
    assert os.readlink(proprietary.install / "current") == f"versions/{VERSION}"


def test_warm_rerun_rebuilds_nothing(
    proprietary: RealInstall, warm: tuple[subprocess.CompletedProcess[str], int]
) -> None:
    result, mtime = warm
    assert result.returncode == 0, result.stderr[-3000:]
    assert "every step was already satisfied" in result.stderr
    assert "step build-modules: already satisfied" in result.stderr
    assert (proprietary.drivers / "nvidia.ko").stat().st_mtime_ns == mtime


def test_plan_names_both_kernel_paths_and_why(proprietary: RealInstall) -> None:
    plan = run_installer_niced(proprietary.env, "plan", timeout=300)
    assert plan.returncode == 0, plan.stderr[-2000:]
    lines = plan.stdout.splitlines()
    source = lines.index(f"  kernel-source-path: {COMMON56}")
    assert f"/lib/modules/{K56}/source" in lines[source + 1]
    assert "include/linux/kernel.h" in lines[source + 1]
    output = lines.index(f"  kernel-output-path: {AMD64_56}")
    assert "include/generated/uapi/linux/version.h" in lines[output + 1]


def test_verify_with_nvidias_nvidia_smi_and_nvml_and_no_driver(proprietary: RealInstall) -> None:
    """NVIDIA's nvidia-smi (exit 9) and NVML (NVMLError_DriverNotLoaded) with no driver loaded:
    a clear error with its reference, exit code and hint; no traceback."""
    result = run_installer_niced(proprietary.env, "verify", timeout=300)
    assert_verify_found_no_driver(result.returncode, result.stdout, result.stderr)


# --- the open flavour: Debian's 6.1.0-47 headers (builds) and 6.1.0-56 (does not) ----------


@pytest.fixture(scope="module")
def open47(tmp_path_factory: pytest.TempPathFactory) -> RealInstall:
    run = runfile(tmp_path_factory)
    root = tmp_path_factory.mktemp("real-open-47") / "host"
    kernel = make_debian_host_with(root, old_headers())
    env = env_for(root, kernel, run, "open")
    result = run_installer_niced(env, "run")
    assert result.returncode == 0, result.stderr[-5000:]
    return RealInstall(root, kernel, env, result, 0.0)


def test_open_modules_build_from_nvidias_kernel_open_tree(open47: RealInstall) -> None:
    nvidia = open47.drivers / "nvidia.ko"
    assert modinfo(nvidia, "version") == VERSION
    assert modinfo(nvidia, "license") == "Dual MIT/GPL"  # kernel-open, not kernel/
    assert modinfo(nvidia, "vermagic").startswith("6.1.0-47-amd64 SMP preempt")
    log = (open47.install / "nvidia-installer-build.log").read_text()
    assert "Kernel source path: '/usr/src/linux-headers-6.1.0-47-common'" in log
    assert "Kernel output path: '/usr/src/linux-headers-6.1.0-47-amd64'" in log
    assert os.readlink(open47.install / "drivers") == (
        f"cache/modules/{VERSION}/6.1.0-47-amd64/open")


def test_both_gsp_firmware_files_are_on_the_hosts_lib_firmware(open47: RealInstall) -> None:
    real = parts()
    host_dir = open47.root / "lib/firmware/nvidia" / VERSION
    assert sorted(p.name for p in host_dir.iterdir()) == list(FIRMWARE)
    for name in FIRMWARE:
        assert same_bytes(host_dir / name, real.firmware / name)
        assert stat.S_IMODE((host_dir / name).stat().st_mode) == 0o644
    assert (host_dir / "gsp_ga10x.bin").stat().st_size > 30 << 20


def test_open_sources_older_than_the_kernel_fail_with_the_compilers_line(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """NVIDIA's 535.261.03 open sources predate 6.1.0-56's pci_resize_resource(): the failure
    quotes gcc's own `error:` line, and the host is as it was."""
    run = runfile(tmp_path_factory)
    root = tmp_path / "host"
    kernel = make_debian_host(root)
    before = tree_snapshot(root)
    result = run_installer_niced(env_for(root, kernel, run, "open"), "run")
    assert result.returncode == 31, result.stderr[-5000:]
    assert "error[module-build-failed]" in result.stderr
    # gcc quotes with U+2018/U+2019 in a UTF-8 locale, with ' in C
    assert re.search(r"nv-pci\.c:\d+:\d+: error: too few arguments to function "
                     r"['\u2018]pci_resize_resource['\u2019]", result.stderr), (
        result.stderr[-5000:])
    assert "the compiler said:" in result.stderr
    inst = install_dir(root)
    assert not (inst / "current").exists()
    assert not (inst / "cache/modules" / VERSION / kernel / "open").exists()
    scratch = inst / "cache/tmp"
    assert not scratch.exists() or not any(scratch.iterdir())
    after = tree_snapshot(root)
    # The install dir (with its parents) holds the downloaded .run for the retry; nothing else.
    outside = {path for path, info in after.items()
               if not path.startswith(INSTALL_DIR_HOST[1:]) and before.get(path) != info
               and not INSTALL_DIR_HOST[1:].startswith(path + "/")}
    assert outside == set(), sorted(outside)[:20]
