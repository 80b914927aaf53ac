"""Debian 13 on NVIDIA's real 550.163.01 parts, all from Debian's trixie archive: `installer run`
with trixie's python3 inside a trixie image root (its gcc-14, make and apt), on two trixie host
roots, building ahead (nothing is loaded here):

- proprietary against the real 6.12 split headers fetched by the image's apt-get through the
  host's deb822 debian.sources (trixie's real header .debs, re-signed, served on 127.0.0.1);
- open against the same headers installed on the host (merged-/usr, the packages' own
  /usr/lib/modules/<k>/{build,source} links). NVIDIA's 550.163.01 open sources predate the
  4-argument pci_resize_resource() that every 6.12 ABI in trixie's archive has (6.12.107 to
  6.12.118 when written): module-build-failed quoting gcc-14's line, the host as it was.

Both builds run side by side in one module fixture (the slow part); everything else asserts on
their results. NVIDIA's real nvidia-smi and NVML then answer "no driver loaded".
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kit.builder import build_real_runfile
from lib.headerrepos import make_key
from lib.hostkit import INSTALL_DIR_HOST, tree_snapshot
from lib.httpfaults import serve_directory
from lib.realdriver import (
    InstalledRoot,
    assert_installed_into,
    assert_verify_found_no_driver,
    elf,
    modinfo,
    nvidias_built_modules,
    same_bytes,
)
from lib.trixie import (
    VERSION,
    headers,
    image_env,
    image_root,
    make_trixie_host,
    parts,
    publish_trixie,
    run_in_image,
)

from installer.release import floors

FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


@dataclass(frozen=True)
class Run(InstalledRoot):
    root: Path
    env: dict[str, str]
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Trixie:
    image: Path
    binds: tuple[Path, ...]
    kernel: str
    proprietary: Run
    open: Run
    open_before: dict[str, tuple[int, int, str]]

    def run(self, env: dict[str, str], *args: str, timeout: float = 600) -> Run:
        proc = run_in_image(self.image, self.binds, env, *args)
        out, err = proc.communicate(timeout=timeout)
        return Run(Path(env["ROOT_MOUNT_DIR"]), env, proc.returncode, out, err)


@pytest.fixture(scope="module")
def trixie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trixie]:
    trees = headers()
    base = tmp_path_factory.getbasetemp()
    runfile = build_real_runfile(tmp_path_factory.mktemp("trixie-run"), parts())
    image = image_root(tmp_path_factory.mktemp("trixie-image") / "root")
    work = tmp_path_factory.mktemp("trixie-archive")
    key = make_key(work / "key")
    publish_trixie(work / "www", trees, key)
    with serve_directory(work / "www") as (archive, _requests):
        roots = {flavour: tmp_path_factory.mktemp(f"trixie-{flavour}") / "host"
                 for flavour in ("proprietary", "open")}
        kernel = make_trixie_host(roots["proprietary"], trees, installed=False,
                                  archive=archive, key=key)
        make_trixie_host(roots["open"], trees, installed=True, archive=archive, key=key)
        envs = {"proprietary": image_env(roots["proprietary"], kernel, runfile, "proprietary",
                                         NVIDIA_INSTALLER_FETCH_HEADERS="true"),
                # The floor debian-13-pci-resize-resource-open-550 refuses this before any
                # compile; accepted here so the compile that the floor rests on is measured.
                "open": image_env(roots["open"], kernel, runfile, "open",
                                  NVIDIA_INSTALLER_ALLOW_BELOW_FLOOR="true")}
        open_before = tree_snapshot(roots["open"])
        # Both compiles at once: one fixture, half the wall time on a multi-core machine.
        procs = {flavour: run_in_image(image, (base,), env, "run")
                 for flavour, env in envs.items()}
        runs = {}
        for flavour, proc in procs.items():
            out, err = proc.communicate(timeout=3000)
            runs[flavour] = Run(roots[flavour], envs[flavour], proc.returncode, out, err)
        yield Trixie(image, (base,), kernel, runs["proprietary"], runs["open"], open_before)


@pytest.fixture(scope="module")
def proprietary(trixie: Trixie) -> Run:
    assert trixie.proprietary.returncode == 0, trixie.proprietary.stderr[-5000:]
    return trixie.proprietary


def gcc_comment(ko: Path) -> str:
    """The compiler ident gcc writes into every object's .comment section."""
    return subprocess.run(["readelf", "-p", ".comment", str(ko)], capture_output=True,
                          text=True, check=True).stdout


def test_trixies_gcc_14_built_nvidias_modules(trixie: Trixie, proprietary: Run) -> None:
    """Not this machine's gcc-12: trixie's gcc-14, chosen because the kernel names it."""
    assert "gcc-14 from the image (the kernel's gcc)" in proprietary.stderr
    for module in ("nvidia.ko", "nvidia-uvm.ko"):
        comment = gcc_comment(proprietary.drivers / module)
        assert "GCC: (Debian 14.2.0-19) 14.2.0" in comment, comment
        assert "GCC: (Debian 12." not in comment


def test_proprietary_modules_from_headers_fetched_through_the_hosts_deb822_sources(
    trixie: Trixie, proprietary: Run,
) -> None:
    k = trixie.kernel
    base = k.removesuffix("-amd64")
    assert k.startswith("6.12.") and k.endswith("+deb13-amd64")
    kbuild = headers().kbuild_package
    assert "/etc/apt/sources.list.d/debian.sources" in proprietary.stderr
    assert (f"linux-headers-{k}, linux-headers-{base}-common, {kbuild} from the host's "
            "package sources") in proprietary.stderr, proprietary.stderr[-4000:]
    cache = proprietary.install / "cache/headers" / k / "root"
    assert (cache / f"usr/src/linux-headers-{k}/Module.symvers").is_file()
    assert (cache / f"usr/lib/{kbuild}/scripts/mod/modpost").is_file()
    # Nothing was installed on the host: the headers live in the install dir's cache only.
    assert not (proprietary.root / "usr/src" / f"linux-headers-{k}").exists()
    log = (proprietary.install / "nvidia-installer-build.log").read_text()
    assert f"Kernel source path: '/usr/src/linux-headers-{base}-common'" in log
    assert f"Kernel output path: '/usr/src/linux-headers-{k}'" in log
    drivers = proprietary.drivers
    for module in nvidias_built_modules(drivers, VERSION):
        assert modinfo(drivers / module, "vermagic").startswith(
            f"{k} SMP preempt mod_unload modversions"), module
    # Merged-/usr: the host's /lib/modules is /usr/lib/modules.
    assert_installed_into(proprietary.root, proprietary.root / "usr/lib/modules", k,
                          drivers / "nvidia.ko")


def test_open_sources_older_than_trixies_kernel_fail_with_gcc_14s_line(trixie: Trixie) -> None:
    """The installed headers were found and used (the build got to gcc), and the failure quotes
    gcc's own `error:` line; the host is as it was."""
    result = trixie.open
    k = trixie.kernel
    assert result.returncode == 31, result.stderr[-5000:]
    assert "error[module-build-failed]" in result.stderr
    assert re.search(r"nv-pci\.c:\d+:\d+: error: too few arguments to function "
                     r"['\u2018]pci_resize_resource['\u2019]", result.stderr), result.stderr[-5000:]
    assert "the compiler said:" in result.stderr
    log = (result.install / "nvidia-installer-build.log").read_text()
    assert f"Kernel output path: '/usr/src/linux-headers-{k}'" in log
    assert "x86_64-linux-gnu-gcc-14" in log
    assert not (result.install / "current").exists()
    assert not (result.install / "cache/modules" / VERSION / k / "open").exists()
    after = tree_snapshot(result.root)
    outside = {path for path, info in after.items()
               if not path.startswith(INSTALL_DIR_HOST[1:]) and trixie.open_before.get(path) != info
               and not INSTALL_DIR_HOST[1:].startswith(path + "/")}
    assert outside == set(), sorted(outside)[:20]


def test_the_floor_that_this_compile_failure_rests_on_applies_to_trixies_kernel(
        trixie: Trixie) -> None:
    """Without NVIDIA_INSTALLER_ALLOW_BELOW_FLOOR the open 550 request stops before the
    compile (tests/unit/test_floors.py); its data names this kernel."""
    shape = floors.HostShape(trixie.kernel, "debian", "13")
    found = {f.id: f for f in floors.applicable(floors.shipped(), shape)}
    floor = found["debian-13-pci-resize-resource-open-550"]
    assert not floor.allows(VERSION, "open") and floor.allows(VERSION, "proprietary")


def test_nvidias_user_space_and_gsp_firmware_land_on_the_host(proprietary: Run) -> None:
    real = parts()
    version_dir = proprietary.install / "versions" / VERSION
    installed = version_dir / "bin/nvidia-smi"
    assert elf(installed) and same_bytes(installed, real.file("nvidia-smi"))
    for library in ("libnvidia-ml", "libcuda"):
        assert same_bytes(version_dir / "lib64" / f"{library}.so.{VERSION}",
                          real.file(f"{library}.so.{VERSION}")), library
    for name in FIRMWARE:
        host_copy = proprietary.root / "lib/firmware/nvidia" / VERSION / name
        assert same_bytes(host_copy, real.firmware / name)
        assert stat.S_IMODE(host_copy.stat().st_mode) == 0o644
    assert os.readlink(proprietary.install / "current") == f"versions/{VERSION}"


def test_plan_on_trixie_names_gcc_14_and_the_split_trees(trixie: Trixie,
                                                         proprietary: Run) -> None:
    plan = trixie.run(proprietary.env, "plan")
    assert plan.returncode == 0, plan.stderr[-3000:]
    base = trixie.kernel.removesuffix("-amd64")
    assert f"/usr/src/linux-headers-{base}-common" in plan.stdout
    assert "gcc-14" in plan.stdout


def test_verify_with_nvidias_550_nvidia_smi_and_nvml_and_no_driver(trixie: Trixie,
                                                                   proprietary: Run) -> None:
    """NVIDIA's real 550 nvidia-smi (exit 9) and NVML (NVMLError_DriverNotLoaded), run from the
    trixie image: the clear error with its reference, exit code and hint; no traceback."""
    result = trixie.run(proprietary.env, "verify")
    assert_verify_found_no_driver(result.returncode, result.stdout, result.stderr)


def test_warm_rerun_in_the_image_rebuilds_nothing(trixie: Trixie, proprietary: Run) -> None:
    mtime = (proprietary.drivers / "nvidia.ko").stat().st_mtime_ns
    again = trixie.run(proprietary.env, "run")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "every step was already satisfied" in again.stderr
    assert (proprietary.drivers / "nvidia.ko").stat().st_mtime_ns == mtime
