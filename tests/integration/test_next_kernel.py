"""The next kernel before the reboot, on host roots with two of Debian's 6.1 kernels:
the run installs for 6.1.0-47 (its headers on the host) while 6.1.0-56 is installed too; the
modules for 6.1.0-56 reach the cache after the install, compiled against headers fetched from
the host's own (signed, local) package sources, or pulled from a real registry, and the first
run on 6.1.0-56 compiles and downloads nothing. Real apt-get, kbuild, docker-registry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kit
import pytest
from lib.headerrepos import apt_sources, make_key, publish_apt, real_debian_debs
from lib.hostkit import (
    INSTALL_DIR_HOST,
    debian_headers,
    installer_env,
    make_debian_host,
    run_installer,
)
from lib.httpfaults import serve_directory
from lib.registrykit import PASSWORD, USER, Registry, make_key_pair
from lib.secondkernel import SECOND, add_headers, mark_installed

from installer.sources.prebuilt.key import vermagic

pytestmark = pytest.mark.skipif(debian_headers() is None or shutil.which("apt-get") is None,
                                reason="needs linux-headers-amd64 and apt-get")

V = "580.105.08"
DIGESTS = Path("/nonexistent")  # the served .run's digests file, set by `served`
NEXT = debian_headers()[0] if debian_headers() else "6.1.0-56-amd64"  # this machine's
UNREACHABLE = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """debian/: Debian's real header packages of NEXT, re-signed; runfiles/: the kit's .run."""
    work = tmp_path_factory.mktemp("archive")
    key = make_key(work / "key")
    debs = real_debian_debs(NEXT)
    if debs is None:
        pytest.fail("Debian's header .debs are missing: run scripts/install-deps")
    publish_apt(work / "www/debian", "bookworm", debs, key)
    kit.build_runfile(V, work / "www/runfiles" / V)
    global DIGESTS
    DIGESTS = kit.write_digests(work / "digests", work / "www/runfiles")
    with serve_directory(work / "www") as (base, _requests):
        yield base, key


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The builder's key pair: host 1 publishes as the builder, both hosts trust its key."""
    return make_key_pair(tmp_path_factory.mktemp("keys"), "builder")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    server = Registry(tmp_path_factory.mktemp("registry")).start()
    yield server
    server.stop()


def two_kernel_host(root: Path, *, headers: bool = True) -> None:
    """Debian 12 with 6.1.0-47 (headers installed: the kernel the run installs for) and
    NEXT installed, its headers not (unattended-upgrades without the headers meta package)."""
    make_debian_host(root, headers=False)
    os.unlink(root / "lib/modules" / NEXT / "build")
    if headers:
        add_headers(root)
    for release in (SECOND, NEXT):
        mark_installed(root, release)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stderr


def install(root: Path) -> Path:
    return root / INSTALL_DIR_HOST.lstrip("/")


def build_of(root: Path, kernel: str) -> Path:
    return install(root) / "cache/modules" / V / kernel / "open"


def plan_line(stdout: str) -> str:
    lines = stdout.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("  next-kernel: ")))
    return lines[at] + "\n" + lines[at + 1]


def test_the_run_prepares_the_next_kernel_and_its_boot_compiles_nothing(
        tmp_path: Path, served: tuple[str, Any], registry: Registry,
        keys: tuple[Path, Path]) -> None:
    base, key = served
    root = tmp_path / "host"
    two_kernel_host(root)
    apt_sources(root, f"{base}/debian", "bookworm", key, deb822=False)
    repository = registry.repository("next/nvidia-modules")
    env = installer_env(
        root, SECOND, NVIDIA_DRIVER_VERSION=V, NVIDIA_DRIVER_MIRRORS=f"{base}/runfiles",
        NVIDIA_DRIVER_DIGESTS_FILE=str(DIGESTS),
        NVIDIA_MODULE_REGISTRY=repository, NVIDIA_MODULE_REGISTRY_PLAIN_HTTP="true",
        NVIDIA_MODULE_REGISTRY_USERNAME=USER, NVIDIA_MODULE_REGISTRY_PASSWORD=PASSWORD,
        NVIDIA_MODULE_REGISTRY_PUSH="true", NVIDIA_MODULE_PUBLISHER_KEY=str(keys[0]),
        NVIDIA_MODULE_TRUSTED_KEYS=str(keys[1]))

    # 1. Fetching headers is off: the next kernel cannot be prepared, the install is not hurt.
    plan = run_installer(env, "plan")
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert plan_line(plan.stdout) == (
        f"  next-kernel: {NEXT}: prepared after this install\n      because after the modules "
        "are installed, before the run ends: pulled from the module registry when an "
        "artifact matches, else compiled against its headers (none found, and fetching is "
        "off); a failure only warns")
    first = ok(run_installer(env, "run"))
    assert "step build-modules: done" in first
    assert (f"next kernel {NEXT}: modules not prepared (error[kernel-headers-missing]: "
            in first), first
    assert (install(root) / "drivers").resolve() == build_of(root, SECOND)
    assert vermagic(build_of(root, SECOND) / "nvidia.ko").startswith(f"{SECOND} SMP")
    status = json.loads(ok_stdout(run_installer(env, "status")))["next_kernel"]
    assert status["kernel"] == NEXT and status["modules_ready"] is False
    assert status["last_attempt"]["state"] == "failed"
    assert status["last_attempt"]["error"]["reference"] == "kernel-headers-missing"

    # 2. With the host's sources: fetched headers, a compile, a publish; nothing else changes.
    env["NVIDIA_INSTALLER_FETCH_HEADERS"] = "auto"
    second = ok(run_installer(env, "run", timeout=600))
    at = {name: second.index(f"step {name}:") for name in (
        "record-install", "prepare-next-kernel", "prune-cache")}
    assert at["record-install"] < at["prepare-next-kernel"] < at["prune-cache"], second
    inner = second[at["prepare-next-kernel"]:at["prune-cache"]]
    assert "step kernel-headers: done" in inner and "step build-modules: done" in inner
    assert ": done in" not in second[:at["prepare-next-kernel"]]  # the install was in place
    assert "every step" not in second
    assert f"next kernel {NEXT}: modules ready in" in second
    assert f"published {repository}:{V}-{NEXT}-open-x86_64-unsigned" in second
    assert vermagic(build_of(root, NEXT) / "nvidia.ko").startswith(f"{NEXT} SMP")
    assert (install(root) / "cache/headers" / NEXT / ".complete").is_file()
    assert not (install(root) / "cache/extracted" / V).exists()  # pruned after the build
    assert not (root / "lib/modules" / NEXT / "updates").exists()  # only the cache
    status = json.loads(ok_stdout(run_installer(env, "status")))["next_kernel"]
    assert status["modules_ready"] is True
    assert status["modules"] == f"{INSTALL_DIR_HOST}/cache/modules/{V}/{NEXT}/open"
    assert status["last_attempt"]["state"] == "ready"
    assert status["last_attempt"]["origin"] == "compiled"
    plan = ok_stdout(run_installer(env, "plan"))
    assert f"  next-kernel: {NEXT}: modules ready" in plan
    assert "every step was already satisfied" in ok(run_installer(env, "run"))

    # 3. The reboot into NEXT: no download (no mirror answers), no headers, no registry.
    built_log = install(root) / "nvidia-installer-build.log"
    log_before = built_log.stat().st_mtime_ns
    boot = installer_env(root, NEXT, NVIDIA_DRIVER_VERSION=V, NVIDIA_DRIVER_MIRRORS=UNREACHABLE,
                         NVIDIA_DRIVER_DOWNLOAD_URL=f"{UNREACHABLE}/NVIDIA.run")
    warm = ok(run_installer(boot, "run"))
    for name in ("kernel-headers", "check-compiler", "fetch-runfile", "extract-runfile",
                 "build-modules"):
        assert f"step {name}: already satisfied" in warm, warm
    assert built_log.stat().st_mtime_ns == log_before
    host_ko = root / "lib/modules" / NEXT / "updates/nvidia-driver-installer/nvidia.ko"
    assert host_ko.read_bytes() == (build_of(root, NEXT) / "nvidia.ko").read_bytes()
    assert (install(root) / "drivers").resolve() == build_of(root, NEXT)


def test_a_separate_command_pulls_the_next_kernels_modules_from_the_registry(
        tmp_path: Path, served: tuple[str, Any], registry: Registry,
        keys: tuple[Path, Path]) -> None:
    """A node with no headers at all (and the long-running container's setting): its install
    and its next kernel both come from the artifacts the first node published."""
    base, _ = served
    repository = registry.repository("next/nvidia-modules")
    if not (registry.storage / "docker/registry/v2/repositories/next/nvidia-modules").is_dir():
        pytest.skip("needs the artifacts the first test published")
    root = tmp_path / "node-b"
    two_kernel_host(root, headers=False)
    env = installer_env(
        root, SECOND, NVIDIA_DRIVER_VERSION=V, NVIDIA_DRIVER_MIRRORS=f"{base}/runfiles",
        NVIDIA_DRIVER_DIGESTS_FILE=str(DIGESTS),
        NVIDIA_MODULE_REGISTRY=repository, NVIDIA_MODULE_REGISTRY_PLAIN_HTTP="true",
        NVIDIA_MODULE_REGISTRY_USERNAME=USER, NVIDIA_MODULE_REGISTRY_PASSWORD=PASSWORD,
        NVIDIA_MODULE_TRUSTED_KEYS=str(keys[1]), NVIDIA_INSTALLER_NEXT_KERNEL="separate")
    run = ok(run_installer(env, "run"))
    assert "using prebuilt modules" in run
    assert "step prepare-next-kernel" not in run and f"next kernel {NEXT}:" not in run
    assert f"next-kernel = {NEXT}: not prepared yet" in run

    prepared = run_installer(env, "prepare-next-kernel")
    assert f"using prebuilt modules {repository}@sha256:" in ok(prepared)
    assert prepared.stdout.strip().startswith(
        f"next kernel {NEXT}: modules ready (pulled {repository}@sha256:")
    assert " modules for kernel " not in prepared.stderr  # no build step ran
    assert vermagic(build_of(root, NEXT) / "nvidia.ko").startswith(f"{NEXT} SMP")
    assert not (install(root) / "cache/extracted" / V).exists()
    again = ok_stdout(run_installer(env, "prepare-next-kernel"))
    assert again.strip() == f"next kernel {NEXT}: modules ready"
    status = json.loads(ok_stdout(run_installer(env, "status")))["next_kernel"]
    assert status["modules_ready"] is True and status["setting"] == "separate"
    assert status["last_attempt"]["origin"].startswith(f"pulled {repository}@sha256:")


def ok_stdout(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout
