"""Compile once per kernel: node A compiles and publishes to a real registry (docker-registry
on 127.0.0.1), node B of the same kernel pulls, verifies and installs with no headers and no
compile; a registry that is down only costs a compile; `prebuild` builds ahead and pushes.
Only what the builder's key signed is ever installed (push credentials are not trust): a
forgery pushed with valid push credentials makes the node compile, and nothing of it reaches
/lib/modules."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import kit
import pytest
from lib.hostkit import INSTALL_DIR_HOST, installer_env, make_debian_host, ok, run_installer
from lib.httpfaults import serve_directory
from lib.marks import needs_headers
from lib.registrykit import PASSWORD, USER, Registry, http_push, make_key_pair

pytestmark = needs_headers

A = "580.105.08"
DIGESTS = Path("/nonexistent")  # the served .run's digests file, set by `served`


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    www = tmp_path_factory.mktemp("www")
    kit.build_runfile(A, www / A)
    global DIGESTS
    DIGESTS = kit.write_digests(www.parent / f"{www.name}.digests", www)
    with serve_directory(www) as (base, _requests):
        yield base


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    where = tmp_path_factory.mktemp("keys")
    return {"builder": make_key_pair(where, "builder"), "other": make_key_pair(where, "other")}


def node_env(root: Path, kernel: str, base: str, repository: str, **extra: str) -> dict[str, str]:
    return installer_env(
        root, kernel, NVIDIA_DRIVER_VERSION=A, NVIDIA_DRIVER_MIRRORS=base,
        NVIDIA_DRIVER_DIGESTS_FILE=str(DIGESTS), NVIDIA_MODULE_REGISTRY=repository,
        NVIDIA_MODULE_REGISTRY_PLAIN_HTTP="true",
        NVIDIA_MODULE_REGISTRY_USERNAME=USER, NVIDIA_MODULE_REGISTRY_PASSWORD=PASSWORD, **extra,
    )


def host_modules(root: Path, kernel: str) -> dict[str, bytes]:
    where = root / "lib/modules" / kernel / "updates/nvidia-driver-installer"
    return {p.name: p.read_bytes() for p in where.glob("*.ko")} if where.is_dir() else {}



def drivers(root: Path) -> dict[str, bytes]:
    found = (root / INSTALL_DIR_HOST.lstrip("/") / "drivers").glob("*.ko")
    return {p.name: p.read_bytes() for p in found}


def test_node_a_publishes_and_node_b_installs_without_compiling(
    tmp_path: Path, served: str, reg: Registry, keys: dict[str, tuple[Path, Path]]
) -> None:
    repository = reg.repository("gpu/nvidia-modules")
    private, public = keys["builder"]
    root_a = tmp_path / "a"
    kernel = make_debian_host(root_a)
    first = ok(run_installer(node_env(root_a, kernel, served, repository,
                                      NVIDIA_MODULE_REGISTRY_PUSH="true",
                                      NVIDIA_MODULE_PUBLISHER_KEY=str(private),
                                      NVIDIA_MODULE_TRUSTED_KEYS=str(public)), "run"))
    assert "prebuilt-modules = none" in first.stderr
    assert "step build-modules: done" in first.stderr
    assert f"published {repository}:{A}-{kernel}-" in first.stderr
    assert PASSWORD not in first.stderr

    root_b = tmp_path / "b"
    make_debian_host(root_b, headers=False)  # no headers at all: only the artifact can do it
    untrusting = ok(run_installer(node_env(root_b, kernel, served, repository), "plan"))
    assert "prebuilt-modules: not trusted" in untrusting.stdout  # no trust root: never used
    env_b = node_env(root_b, kernel, served, repository, NVIDIA_MODULE_TRUSTED_KEYS=str(public))
    plan = ok(run_installer(env_b, "plan"))
    assert f"prebuilt-modules: {repository}@sha256:" in plan.stdout
    assert "digest sha256:" in plan.stdout and "signed by sha256:" in plan.stdout

    second = ok(run_installer(env_b, "run"))

    assert "using prebuilt modules" in second.stderr
    assert "step kernel-headers: already satisfied" in second.stderr
    assert "step build-modules: already satisfied" in second.stderr
    assert " modules for kernel " not in second.stderr  # the build step's log line
    assert not (root_b / INSTALL_DIR_HOST.lstrip("/") / "nvidia-installer-build.log").exists()
    assert drivers(root_b) == drivers(root_a) and len(drivers(root_b)) == 3
    assert host_modules(root_b, kernel)["nvidia.ko"] == drivers(root_a)["nvidia.ko"]
    # Warm: a second run never asks the registry, and checks the cached signature again.
    reg.stop()
    try:
        third = ok(run_installer(env_b, "run"))
    finally:
        reg.start()
    assert "prebuilt-modules = not needed" in third.stderr
    assert "signature verified again" in third.stderr

    # The operator rotates the trust root: the cached pulled modules are not used any more.
    rotated = {**env_b, "NVIDIA_MODULE_TRUSTED_KEYS": str(keys["other"][1])}
    fourth = run_installer(rotated, "run")
    assert "prebuilt-modules = cache dropped" in fourth.stderr
    assert "are not used: none of the 1 signature(s)" in fourth.stderr
    assert "error[artifact-untrusted]" in fourth.stderr  # the registry's copy is not either
    assert fourth.returncode == 30, fourth.stderr[-2000:]  # so it compiles: no headers here
    assert "error[kernel-headers-missing]" in fourth.stderr
    assert drivers(root_b) == {}


def test_a_forged_artifact_pushed_without_the_key_never_reaches_the_kernel(
    tmp_path: Path, served: str, reg: Registry, keys: dict[str, tuple[Path, Path]]
) -> None:
    """The attack end to end: the builder publishes; someone with valid push
    credentials but without the builder's key re-pushes the tag through the registry's HTTP
    API with a tampered nvidia.ko and an extra overlay.ko; a node compiles instead."""
    repository = reg.repository("fleet/nvidia-modules")
    private, public = keys["builder"]
    builder = tmp_path / "builder"
    kernel = make_debian_host(builder, gpus=())
    env = node_env(builder, kernel, served, repository, NVIDIA_MODULE_PUBLISHER_KEY=str(private))
    env.pop("NVIDIA_KERNEL_RELEASE")
    published = ok(run_installer(env, "prebuild", "--kernel", kernel, "--push"))
    # the module cache's (nvidia-installer builds in the extracted tree: one there too)
    (built,) = (builder / INSTALL_DIR_HOST.lstrip("/") / "cache/modules").rglob("nvidia.ko")
    genuine = {p.name: p.read_bytes() for p in built.parent.glob("*.ko")}

    from installer.delivery import artifact

    forged = {**genuine, "nvidia.ko": genuine["nvidia.ko"] + b"\0forged by the attacker\0",
              "overlay.ko": genuine["nvidia-uvm.ko"]}
    entries = [artifact.ModuleFile(n, hashlib.sha256(b).hexdigest(), len(b))
               for n, b in forged.items()]
    key = artifact.ArtifactKey(A, kernel, "open", "x86_64")
    config = artifact.config_for(key, entries)
    manifest = artifact.manifest_for(config, entries, key)
    host, name = repository.split("/", 1)
    forged_digest = http_push(host, name, key.tag(), [*forged.values(), config], manifest)
    assert forged_digest not in published.stdout

    node = tmp_path / "node"
    make_debian_host(node)
    trusted = node_env(node, kernel, served, repository, NVIDIA_MODULE_TRUSTED_KEYS=str(public))
    required = run_installer({**trusted, "NVIDIA_MODULE_REQUIRE_PREBUILT": "true"}, "run")
    assert required.returncode == 88, required.stderr[-2000:]
    assert "error[prebuilt-modules-required]" in required.stderr
    assert host_modules(node, kernel) == {}  # nothing installed

    result = ok(run_installer(trusted, "run"))

    assert "prebuilt-modules = untrusted" in result.stderr
    assert "error[artifact-untrusted]" in result.stderr and forged_digest in result.stderr
    assert "step build-modules: done" in result.stderr
    installed = host_modules(node, kernel)
    assert sorted(installed) == ["nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]
    assert b"\0forged by the attacker\0" not in installed["nvidia.ko"]
    assert not any((node / "lib/modules").rglob("overlay.ko"))


def test_a_registry_that_is_down_costs_a_compile_not_the_install(
    tmp_path: Path, served: str, keys: dict[str, tuple[Path, Path]]
) -> None:
    dead = Registry(tmp_path / "dead")  # never started: connections are refused
    root = tmp_path / "c"
    kernel = make_debian_host(root)
    result = ok(run_installer(
        node_env(root, kernel, served, dead.repository("gpu/m"),
                 NVIDIA_MODULE_REGISTRY_PUSH="true", NVIDIA_MODULE_PUBLISHER_KEY=str(
                     keys["builder"][0]), NVIDIA_MODULE_TRUSTED_KEYS=str(keys["builder"][1])),
        "run"))
    assert "prebuilt-modules = unavailable" in result.stderr
    assert "step build-modules: done" in result.stderr
    assert "modules not published (error[registry-unavailable]" in result.stderr
    assert len(drivers(root)) == 3


def test_prebuild_pushes_for_a_kernel_that_is_not_running(
    tmp_path: Path, served: str, reg: Registry, keys: dict[str, tuple[Path, Path]]
) -> None:
    repository = reg.repository("ci/prebuilt")
    root = tmp_path / "ci"
    kernel = make_debian_host(root, gpus=())
    env = node_env(root, kernel, served, repository,
                   NVIDIA_MODULE_PUBLISHER_KEY=str(keys["builder"][0]))
    env.pop("NVIDIA_KERNEL_RELEASE")
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")
    del env["NVIDIA_MODULE_REGISTRY_PASSWORD"]
    env["NVIDIA_MODULE_REGISTRY_PASSWORD_FILE"] = str(password_file)

    result = ok(run_installer(env, "prebuild", "--kernel", kernel, "--push"))

    assert result.stdout.strip().startswith(f"{repository}@sha256:")
    assert not (root / "lib/modules" / kernel / "updates").exists()  # nothing installed
    password_file.write_text("wrong\n")
    refused = run_installer(env, "prebuild", "--kernel", kernel, "--push")
    assert refused.returncode == 76, refused.stderr[-2000:]
    assert "error[registry-auth-failed]" in refused.stderr
    unsigned = {k: v for k, v in env.items() if k != "NVIDIA_MODULE_PUBLISHER_KEY"}
    keyless = run_installer(unsigned, "prebuild", "--kernel", kernel, "--push")
    assert keyless.returncode == 10 and "needs NVIDIA_MODULE_PUBLISHER_KEY" in keyless.stderr
    nowhere = {k: v for k, v in env.items() if k != "NVIDIA_MODULE_REGISTRY"}
    for argv in (("prebuild", "--kernel", kernel, "--push"), ("run",)):
        silent = run_installer({**nowhere, "NVIDIA_MODULE_REGISTRY_PUSH": "true"}, *argv)
        assert silent.returncode == 10, silent.stderr[-2000:]  # not a silent no-op
        assert "needs NVIDIA_MODULE_REGISTRY: there is nowhere to publish" in silent.stderr
