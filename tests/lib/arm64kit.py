"""arm64 in tests: NVIDIA's real arm64 parts, the aarch64 .run the kit packs from them, an x86
builder's host root with Debian's arm64 headers, and `installer prebuild --arch aarch64` on it
(once per session and flavour, shared by the integration and vm tiers of one process)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from kit import arm64_parts
from kit.builder import build_real_arm64_runfile

from lib.hostkit import installer_env
from lib.realdriver import (
    VERSION,
    env_for,
    install_dir,
    make_debian_host_with,
    once_per_session,
    parts,
    required,
    run_installer_niced,
)

KERNEL = arm64_parts.KERNEL
_SESSION: dict[str, object] = {}


def arm64() -> arm64_parts.Arm64Parts:
    return required(arm64_parts.require)


def arm64_run(factory: pytest.TempPathFactory) -> Path:
    """NVIDIA-Linux-aarch64-535.261.03.run with NVIDIA's real arm64 module trees (kit-cached)."""
    return once_per_session("arm64-run", lambda: build_real_arm64_runfile(
        factory.mktemp("arm64-run"), parts(), arm64()))


def arm64_builder(root: Path) -> str:
    """An x86 builder's root holding Debian's arm64 headers with the amd64 kbuild."""
    return make_debian_host_with(root, arm64().headers, gpus=())


def prebuild_env(root: Path, run: Path, flavour: str, **settings: str) -> dict[str, str]:
    env = env_for(root, KERNEL, run, flavour, **settings)
    env.pop("NVIDIA_KERNEL_RELEASE")
    return env


def build_dir(root: Path, flavour: str) -> Path:
    return install_dir(root) / "cache/modules" / VERSION / KERNEL / flavour


def remember(flavour: str, build: Path, result: subprocess.CompletedProcess[str]) -> None:
    """A cross build of `flavour` made elsewhere (test_cross_build's, which also pushes): the
    arm64 guest's fixture loads its modules instead of compiling them again (the two files run
    in one worker, the arm64 xdist group)."""
    if result.returncode == 0:
        _SESSION.setdefault(f"build-{flavour}", (build, result))


def cross_build(factory: pytest.TempPathFactory, flavour: str
                ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`installer prebuild --arch aarch64` of `flavour` on a fresh builder, once per session."""
    key = f"build-{flavour}"
    found = _SESSION.get(key)
    if isinstance(found, tuple):
        return found
    root = factory.mktemp(f"cross-{flavour}") / "host"
    assert arm64_builder(root) == KERNEL
    env = prebuild_env(root, arm64_run(factory), flavour)
    result = run_installer_niced(env, "prebuild", "--arch", "aarch64", "--kernel", KERNEL)
    _SESSION[key] = (build_dir(root, flavour), result)
    return build_dir(root, flavour), result


def publish(factory: pytest.TempPathFactory, flavour: str, **settings: str
            ) -> subprocess.CompletedProcess[str]:
    """`installer prebuild --arch aarch64 --push` of NVIDIA's real `flavour` with `settings`
    (the registry, the publisher key): on the builder of this session's cross build of that
    flavour, whose cached modules it pushes without compiling them again."""
    build, result = cross_build(factory, flavour)
    assert result.returncode == 0, result.stderr[-4000:]
    root = builder_root(build)
    env = prebuild_env(root, arm64_run(factory), flavour, **settings)
    return run_installer_niced(env, "prebuild", "--arch", "aarch64", "--kernel", KERNEL, "--push")


def builder_root(build: Path) -> Path:
    """The builder's host root of a build directory (build_dir's inverse)."""
    install = build.parents[4]
    return Path(str(install).removesuffix(str(install_dir(Path("/")))))


def publish_kit(factory: pytest.TempPathFactory, version: str, flavour: str, run: Path,
                **settings: str) -> subprocess.CompletedProcess[str]:
    """`installer prebuild --arch aarch64 --push` of the kit's aarch64 .run `run` (its own
    modules, the ones that bind the stand-in GPU) against Debian's real arm64 headers."""
    root = factory.mktemp(f"kit-cross-{flavour}") / "host"
    assert arm64_builder(root) == KERNEL
    env = installer_env(root, KERNEL, NVIDIA_DRIVER_VERSION=version,
                        NVIDIA_KERNEL_MODULE_TYPE=flavour,
                        NVIDIA_DRIVER_DOWNLOAD_URL=f"file://{run}", **settings)
    env.pop("NVIDIA_KERNEL_RELEASE")
    return run_installer_niced(env, "prebuild", "--arch", "aarch64", "--kernel", KERNEL, "--push")
