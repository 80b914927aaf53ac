"""`installer prebuild --arch aarch64` on this x86 machine: NVIDIA's real arm64 535.261.03 module
sources (both flavours, the aarch64 .run the kit packs from Debian's arm64 packages) cross-built
against Debian's real arm64 6.1.0-47 headers with the aarch64 cross compiler, and published,
signed, to a real OCI registry under the aarch64 key. Each flavour is compiled once (minutes)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from lib.arm64kit import (
    KERNEL,
    arm64,
    arm64_builder,
    arm64_run,
    build_dir,
    prebuild_env,
    remember,
)
from lib.hostkit import make_debian_host
from lib.realdriver import VERSION, env_for, install_dir, modinfo, run_installer_niced
from lib.registrykit import PASSWORD, USER, Registry, make_key_pair

AARCH64 = 183  # ELF e_machine
FLAVOURS = ("proprietary", "open")
MODULES = {"nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-peermem.ko"}


@pytest.fixture(scope="module")
def arm64_run_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return arm64_run(tmp_path_factory)


def registry_settings(repository: str) -> dict[str, str]:
    return {"NVIDIA_MODULE_REGISTRY": repository, "NVIDIA_MODULE_REGISTRY_PLAIN_HTTP": "true",
            "NVIDIA_MODULE_REGISTRY_USERNAME": USER, "NVIDIA_MODULE_REGISTRY_PASSWORD": PASSWORD}


Published = Callable[[str], "tuple[Path, subprocess.CompletedProcess[str]]"]


@pytest.fixture(scope="module")
def published(arm64_run_file: Path, reg: Registry, tmp_path_factory: pytest.TempPathFactory
              ) -> Published:
    """A flavour cross-built and pushed by `prebuild --arch aarch64 --push`, once each, when a
    test first asks for it."""
    private, _ = make_key_pair(tmp_path_factory.mktemp("cross-keys"))
    repository = reg.repository("fleet/nvidia-modules")
    done: dict[str, tuple[Path, subprocess.CompletedProcess[str]]] = {}

    def get(flavour: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
        if flavour not in done:
            root = tmp_path_factory.mktemp(f"cross-{flavour}") / "host"
            assert arm64_builder(root) == KERNEL
            env = prebuild_env(root, arm64_run_file, flavour, **registry_settings(repository),
                               NVIDIA_MODULE_PUBLISHER_KEY=str(private))
            result = run_installer_niced(env, "prebuild", "--arch", "aarch64", "--kernel",
                                         KERNEL, "--push")
            done[flavour] = (build_dir(root, flavour), result)
            remember(flavour, *done[flavour])
        return done[flavour]

    return get


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_real_arm64_modules_are_cross_built_as_aarch64_objects(
        published: Published, flavour: str) -> None:
    build, result = published(flavour)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "cross-building" in result.stderr
    assert {p.name for p in build.glob("*.ko")} == MODULES
    # The arm64 kernel's own modules' vermagic (`6.1.0-47-arm64 SMP mod_unload modversions
    # aarch64`): the kernel accepts a module only with exactly this.
    kernels = modinfo(arm64().modules / "kernel/drivers/gpu/drm/drm.ko", "vermagic")
    assert kernels.startswith(f"{KERNEL} SMP ") and kernels.endswith(" aarch64")
    for ko in build.glob("*.ko"):
        head = ko.read_bytes()[:20]
        assert head[:4] == b"\x7fELF" and head[4] == 2  # ELF64
        assert int.from_bytes(head[18:20], "little") == AARCH64, ko.name
        assert modinfo(ko, "vermagic") == kernels, ko.name
    assert modinfo(build / "nvidia.ko", "version") == VERSION
    license_ = modinfo(build / "nvidia.ko", "license")
    assert license_ == ("Dual MIT/GPL" if flavour == "open" else "NVIDIA")
    # The extracted .run is left as it came: the build ran in a copy.
    extracted = build.parents[3] / "extracted" / VERSION
    if extracted.is_dir():
        assert not list(extracted.rglob("*.ko"))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_cross_built_modules_are_published_under_the_aarch64_key(
        published: Published, reg: Registry, flavour: str) -> None:
    build, result = published(flavour)
    assert result.returncode == 0, result.stderr[-5000:]
    repository = reg.repository("fleet/nvidia-modules")
    assert result.stdout.strip().startswith(f"{repository}@sha256:")
    tags = reg.storage / "docker/registry/v2/repositories/fleet/nvidia-modules/_manifests/tags"
    assert (tags / f"{VERSION}-{KERNEL}-{flavour}-aarch64-unsigned").is_dir()
    blobs = sorted(p.stat().st_size
                   for p in (reg.storage / "docker/registry/v2/blobs").rglob("data"))
    assert all(ko.stat().st_size in blobs for ko in build.glob("*.ko"))
    # The aarch64 user space is left to an arm64 node: its nvidia-installer cannot run here.
    assert "user space is not published by a cross build" in result.stderr
    assert not (tags / f"{VERSION}-userspace-aarch64").exists()
    assert PASSWORD not in result.stdout + result.stderr


def test_amd64_headers_are_refused_for_an_aarch64_build(
        arm64_run_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "host"
    kernel = make_debian_host(root, gpus=())  # this machine's x86 headers
    env = env_for(root, kernel, arm64_run_file, "open")
    env.pop("NVIDIA_KERNEL_RELEASE")
    result = run_installer_niced(env, "prebuild", "--arch", "aarch64", "--kernel", kernel,
                                 timeout=900)
    assert result.returncode == 67, result.stderr[-3000:]
    assert "error[headers-wrong-arch]" in result.stderr
    assert "configured for x86_64, not aarch64" in result.stderr
    assert not list((install_dir(root) / "cache/modules").rglob("*.ko"))


def test_arm64_kbuild_programs_are_refused_on_this_builder(
        arm64_run_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "host"
    arm64_builder(root)
    # Debian's arm64 linux-kbuild: its programs are aarch64 executables.
    fixdep = root / "usr/lib/linux-kbuild-6.1/scripts/basic/fixdep"
    fixdep.unlink()  # a hard link into the cache: replaced, never written through
    source = tmp_path / "fixdep.c"
    source.write_text("int main(void) { return 0; }\n")
    subprocess.run(["aarch64-linux-gnu-gcc", "-o", str(fixdep), str(source)], check=True)
    env = prebuild_env(root, arm64_run_file, "open")
    result = run_installer_niced(env, "prebuild", "--arch", "aarch64", "--kernel", KERNEL,
                                 timeout=900)
    assert result.returncode == 68, result.stderr[-3000:]
    assert "error[kbuild-tools-wrong-arch]" in result.stderr
    assert "is a aarch64 program" in result.stderr or "an aarch64 program" in result.stderr


def test_a_missing_cross_compiler_is_named(arm64_run_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "host"
    arm64_builder(root)
    # A kernel built with a gcc major no cross compiler here has.
    for name in (".config", "include/config/auto.conf"):
        config = root / f"usr/src/linux-headers-{KERNEL}" / name
        text = config.read_text()
        config.unlink()  # a hard link into the cache: replaced, never written through
        config.write_text(text.replace("CONFIG_GCC_VERSION=120200", "CONFIG_GCC_VERSION=990100"))
    env = prebuild_env(root, arm64_run_file, "open")
    result = run_installer_niced(env, "prebuild", "--arch", "aarch64", "--kernel", KERNEL,
                                 timeout=900)
    assert result.returncode == 66, result.stderr[-3000:]
    assert "error[cross-compiler-missing]" in result.stderr
    assert "aarch64-linux-gnu-gcc-99" in result.stderr
    assert shutil.which("aarch64-linux-gnu-gcc-12")  # the real one is there; 99 is not
