"""NVIDIA's real 535.261.03 driver parts in tests: the .run the kit packs from them, Debian host
roots with Debian's split headers, and `installer run` building NVIDIA's real modules, done once
per pytest session and shared by the tiers that need it (integration, registry, vm).

The parts come from the cache `scripts/install-deps` fills (kit.real_parts); a missing cache
fails the test with a pointer to install-deps (never a skip). NVIDIA's real compiles run under
`nice -n 10`: they take minutes, and the machine is shared.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from kit import real_parts
from kit.builder import build_real_runfile

from lib.hostkit import (
    GCC_LINE,
    INSTALL_DIR_HOST,
    RUNNING_KERNEL,
    hidden_headers_argv,
    installer_argv,
    installer_env,
    make_debian_host,
)
from lib.hosttrees import make_host

VERSION = real_parts.VERSION
BUILD_TIMEOUT = 2400  # a real compile: 2-5 min on 2 cores, more under load

_SESSION: dict[str, object] = {}
T = TypeVar("T")


def required(find: Callable[[], T]) -> T:
    """What `find` takes from the kit's cache of NVIDIA's parts; where the cache lacks it, the
    test fails with the pointer to scripts/install-deps (never a skip)."""
    try:
        return find()
    except real_parts.PartsMissing as exc:
        pytest.fail(str(exc), pytrace=False)


def once_per_session(key: str, build: Callable[[], Path]) -> Path:
    """`build()`'s path, built by the first test of the session that asks for `key`."""
    found = _SESSION.get(key)
    if not isinstance(found, Path):
        found = build()
        _SESSION[key] = found
    return found


def parts() -> real_parts.RealParts:
    return required(real_parts.require)


def old_headers() -> real_parts.HeaderTrees:
    return required(real_parts.require_old_headers)


def runfile(factory: pytest.TempPathFactory) -> Path:
    """NVIDIA-Linux-x86_64-535.261.03.run with NVIDIA's real parts (built once, kit-cached)."""
    return once_per_session(
        "runfile", lambda: build_real_runfile(factory.mktemp("real-run"), parts()))


def run_installer_niced(env: dict[str, str], *args: str,
                        timeout: float = BUILD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Like hostkit.run_installer (this machine's headers hidden), at nice 10."""
    return subprocess.run(["nice", "-n", "10", *hidden_headers_argv(installer_argv(*args))],
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)


def make_debian_host_with(root: Path, trees: real_parts.HeaderTrees,
                          gpus: tuple[int, ...] = (0x2330,)) -> str:
    """A Debian 12 host root holding `trees` (Debian's -amd64, -common and kbuild, with the
    /lib/modules/<k>/{build,source} links as the packages ship them); the running kernel
    differs, so nothing is loaded. Returns the headers' kernel release."""
    make_host(root, distro="debian-12", kernel=RUNNING_KERNEL, gpus=gpus)
    for sub in ("usr/src", "usr/lib", f"lib/modules/{trees.kernel}"):
        source = trees.root / sub
        dest = root / sub
        dest.mkdir(parents=True, exist_ok=True)
        for entry in source.iterdir():
            if subprocess.run(["cp", "-al", str(entry), str(dest / entry.name)],
                              check=False).returncode != 0:
                shutil.copytree(entry, dest / entry.name, symlinks=True)
    (root / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/modprobe.d").mkdir(parents=True, exist_ok=True)
    (root / "proc/version").write_text(GCC_LINE.format(k=RUNNING_KERNEL))
    return trees.kernel


def env_for(root: Path, kernel: str, run: Path, flavour: str, **settings: str) -> dict[str, str]:
    return installer_env(root, kernel, NVIDIA_DRIVER_VERSION=VERSION,
                         NVIDIA_KERNEL_MODULE_TYPE=flavour,
                         NVIDIA_DRIVER_DOWNLOAD_URL=f"file://{run}", **settings)


def install_dir(root: Path) -> Path:
    return root / INSTALL_DIR_HOST.lstrip("/")


class InstalledRoot:
    """Where a host root the installer ran on keeps the install dir and the modules it built
    (a base of the dataclasses that hold such a root)."""

    root: Path

    @property
    def install(self) -> Path:
        return install_dir(self.root)

    @property
    def drivers(self) -> Path:
        return self.install / "drivers"


@dataclass(frozen=True)
class RealInstall(InstalledRoot):
    """A Debian host root after `installer run` of the real driver, built ahead for `kernel`."""

    root: Path
    kernel: str
    env: dict[str, str]
    result: subprocess.CompletedProcess[str]
    seconds: float

    @property
    def build_dir(self) -> Path:
        return self.install / "cache/modules" / VERSION / self.kernel / "proprietary"


def proprietary_install(factory: pytest.TempPathFactory) -> RealInstall:
    """NVIDIA's real proprietary modules built through `installer run` for Debian's split
    6.1.0-56 headers (this machine's), once per session."""
    found = _SESSION.get("proprietary")
    if isinstance(found, RealInstall):
        return found
    run = runfile(factory)
    root = factory.mktemp("real-proprietary") / "host"
    kernel = make_debian_host(root)
    env = env_for(root, kernel, run, "proprietary")
    started = time.monotonic()
    result = run_installer_niced(env, "run")
    installed = RealInstall(root, kernel, env, result, time.monotonic() - started)
    _SESSION["proprietary"] = installed
    return installed


def seed_modules(build: Path, install: Path, kernel: str, flavour: str = "proprietary") -> Path:
    """Copy a finished build (as build-modules leaves it) into another install dir's cache."""
    dest = install / "cache/modules" / VERSION / kernel / flavour
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(build, dest)
    return dest


def modinfo(ko: Path, field: str) -> str:
    return subprocess.run(["modinfo", "-F", field, str(ko)], capture_output=True, text=True,
                          check=True).stdout.strip()


def nvidias_built_modules(drivers: Path, version: str) -> list[str]:
    """The .ko files in `drivers`, checked to be what NVIDIA's proprietary tree builds with
    --no-drm and its nvidia.ko NVIDIA's own of `version`."""
    built = sorted(p.name for p in drivers.glob("*.ko"))
    # --no-drm: nvidia-drm is left out; NVIDIA's tree also builds nvidia-peermem.
    assert built == ["nvidia-modeset.ko", "nvidia-peermem.ko", "nvidia-uvm.ko", "nvidia.ko"]
    nvidia = drivers / "nvidia.ko"
    assert modinfo(nvidia, "version") == version
    assert modinfo(nvidia, "license") == "NVIDIA"
    assert nvidia.stat().st_size > 50 << 20  # NVIDIA's nv-kernel.o_binary is linked in
    return built


def assert_installed_into(root: Path, modules_dir: Path, kernel: str, nvidia: Path) -> None:
    """`nvidia` copied into the host's `modules_dir`/<kernel>/updates tree and depmod's
    modules.dep listing nvidia-uvm's dependency on it."""
    host_dir = modules_dir / kernel / "updates/nvidia-driver-installer"
    assert same_bytes(host_dir / "nvidia.ko", nvidia)
    depmod = (root / "lib/modules" / kernel / "modules.dep").read_text()
    assert ("updates/nvidia-driver-installer/nvidia-uvm.ko: "
            "updates/nvidia-driver-installer/nvidia.ko") in depmod


def assert_verify_found_no_driver(returncode: int, stdout: str, stderr: str) -> None:
    """`installer verify` with NVIDIA's nvidia-smi (exit 9) and NVML (NVMLError_DriverNotLoaded)
    and no driver loaded: a clear error with its reference, exit code and hint; no traceback."""
    output = stdout + stderr
    assert returncode == 40, output[-3000:]
    assert "error[verification-failed]" in stderr
    assert "nvidia-smi could not communicate with the driver (exit 9)" in output
    assert "NVMLError_DriverNotLoaded" in output and "Driver Not Loaded" in output
    assert "hint:" in stderr.lower()
    assert "Traceback" not in output


def same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with a.open("rb") as left, b.open("rb") as right:
        while True:
            chunk = left.read(1 << 20)
            if chunk != right.read(1 << 20):
                return False
            if not chunk:
                return True


def elf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"\x7fELF"

