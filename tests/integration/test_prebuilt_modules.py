"""Compile once per kernel: node A compiles and publishes to a real registry (docker-registry
on 127.0.0.1), node B of the same kernel pulls, verifies and installs with no headers and no
compile; a registry that is down only costs a compile; `prebuild` builds ahead and pushes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kit
import pytest
from hostkit import INSTALL_DIR_HOST, debian_headers, installer_env, make_debian_host, run_installer
from httpfaults import serve_directory
from registrykit import PASSWORD, USER, Registry

pytestmark = pytest.mark.skipif(debian_headers() is None, reason="needs linux-headers-amd64")

A = "580.105.08"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    www = tmp_path_factory.mktemp("www")
    kit.build_runfile(A, www / A)
    with serve_directory(www) as (base, _requests):
        yield base


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    server = Registry(tmp_path_factory.mktemp("registry")).start()
    yield server
    server.stop()


def node_env(root: Path, kernel: str, base: str, repository: str, **extra: str) -> dict[str, str]:
    return installer_env(
        root, kernel, NVIDIA_DRIVER_VERSION=A, NVIDIA_DRIVER_MIRRORS=base,
        NVIDIA_MODULE_REGISTRY=repository, NVIDIA_MODULE_REGISTRY_PLAIN_HTTP="true",
        NVIDIA_MODULE_REGISTRY_USERNAME=USER, NVIDIA_MODULE_REGISTRY_PASSWORD=PASSWORD, **extra,
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def drivers(root: Path) -> dict[str, bytes]:
    found = (root / INSTALL_DIR_HOST.lstrip("/") / "drivers").glob("*.ko")
    return {p.name: p.read_bytes() for p in found}


def test_node_a_publishes_and_node_b_installs_without_compiling(
    tmp_path: Path, served: str, reg: Registry
) -> None:
    repository = reg.repository("gpu/nvidia-modules")
    root_a = tmp_path / "a"
    kernel = make_debian_host(root_a)
    first = ok(run_installer(node_env(root_a, kernel, served, repository,
                                      NVIDIA_MODULE_REGISTRY_PUSH="true"), "run"))
    assert "prebuilt-modules = none" in first.stderr
    assert "step build-modules: done" in first.stderr
    assert f"published {repository}:{A}-{kernel}-" in first.stderr
    assert PASSWORD not in first.stderr

    root_b = tmp_path / "b"
    make_debian_host(root_b, headers=False)  # no headers at all: only the artifact can do it
    env_b = node_env(root_b, kernel, served, repository)
    plan = ok(run_installer(env_b, "plan"))
    assert f"prebuilt-modules: {repository}@sha256:" in plan.stdout
    assert "digest sha256:" in plan.stdout

    second = ok(run_installer(env_b, "run"))

    assert "using prebuilt modules" in second.stderr
    assert "step kernel-headers: already satisfied" in second.stderr
    assert "step build-modules: already satisfied" in second.stderr
    assert " modules for kernel " not in second.stderr  # the build step's log line
    assert not (root_b / INSTALL_DIR_HOST.lstrip("/") / "nvidia-installer-build.log").exists()
    assert drivers(root_b) == drivers(root_a) and len(drivers(root_b)) == 3
    host_ko = root_b / "lib/modules" / kernel / "updates/nvidia-driver-installer/nvidia.ko"
    assert host_ko.read_bytes() == drivers(root_a)["nvidia.ko"]
    # Warm: a second run never asks the registry.
    reg.stop()
    try:
        third = ok(run_installer(env_b, "run"))
    finally:
        reg.start()
    assert "prebuilt-modules = not needed" in third.stderr


def test_a_registry_that_is_down_costs_a_compile_not_the_install(
    tmp_path: Path, served: str
) -> None:
    dead = Registry(tmp_path / "dead")  # never started: connections are refused
    root = tmp_path / "c"
    kernel = make_debian_host(root)
    result = ok(run_installer(
        node_env(root, kernel, served, dead.repository("gpu/m"),
                 NVIDIA_MODULE_REGISTRY_PUSH="true"), "run"))
    assert "prebuilt-modules = unavailable" in result.stderr
    assert "step build-modules: done" in result.stderr
    assert "modules not published (error[registry-unavailable]" in result.stderr
    assert len(drivers(root)) == 3


def test_prebuild_pushes_for_a_kernel_that_is_not_running(
    tmp_path: Path, served: str, reg: Registry, request: Any
) -> None:
    repository = reg.repository("ci/prebuilt")
    root = tmp_path / "ci"
    kernel = make_debian_host(root, gpus=())
    env = node_env(root, kernel, served, repository)
    env.pop("NVIDIA_KERNEL_RELEASE")

    result = ok(run_installer(env, "prebuild", "--kernel", kernel, "--push"))

    assert result.stdout.strip().startswith(f"{repository}@sha256:")
    assert not (root / "lib/modules" / kernel / "updates").exists()  # nothing installed
    unauthorised = {**env, "NVIDIA_MODULE_REGISTRY_PASSWORD": "wrong"}
    refused = run_installer(unauthorised, "prebuild", "--kernel", kernel, "--push")
    assert refused.returncode == 76, refused.stderr[-2000:]
    assert "error[registry-auth-failed]" in refused.stderr
