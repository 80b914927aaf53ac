"""NVIDIA's real 535.261.03 modules (about 135 MB) through a real OCI registry
(docker-registry on 127.0.0.1): `installer prebuild --push` publishes, signed with the builder's
key, the session's real build (test_real_driver's, compiled once), and a node with no kernel
headers that trusts that key pulls, verifies and installs them without compiling."""

from __future__ import annotations

import pytest
from lib.hostkit import make_debian_host, ok
from lib.marks import needs_headers
from lib.realdriver import (
    VERSION,
    RealInstall,
    env_for,
    install_dir,
    modinfo,
    proprietary_install,
    run_installer_niced,
    runfile,
    same_bytes,
    seed_modules,
)
from lib.registrykit import PASSWORD, USER, Registry, make_key_pair

pytestmark = needs_headers


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> RealInstall:
    installed = proprietary_install(tmp_path_factory)
    assert installed.result.returncode == 0, installed.result.stderr[-5000:]
    return installed


def registry_settings(repository: str) -> dict[str, str]:
    return {"NVIDIA_MODULE_REGISTRY": repository, "NVIDIA_MODULE_REGISTRY_PLAIN_HTTP": "true",
            "NVIDIA_MODULE_REGISTRY_USERNAME": USER, "NVIDIA_MODULE_REGISTRY_PASSWORD": PASSWORD}



def test_real_modules_are_published_once_and_pulled_by_a_node_without_headers(
    built: RealInstall, reg: Registry, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run = runfile(tmp_path_factory)
    repository = reg.repository("fleet/nvidia-modules")
    private, public = make_key_pair(tmp_path_factory.mktemp("real-keys"))
    builder = tmp_path_factory.mktemp("real-builder") / "host"
    kernel = make_debian_host(builder, gpus=())
    seed_modules(built.build_dir, install_dir(builder), kernel)
    env = env_for(builder, kernel, run, "proprietary", **registry_settings(repository),
                  NVIDIA_MODULE_PUBLISHER_KEY=str(private))
    env.pop("NVIDIA_KERNEL_RELEASE")
    pushed = ok(run_installer_niced(env, "prebuild", "--kernel", kernel, "--push", timeout=900))
    reference = pushed.stdout.strip()
    assert reference.startswith(f"{repository}@sha256:")
    digest = reference.split("@", 1)[1]
    assert reg.blob_path(digest).is_file()
    blob_sizes = sorted(p.stat().st_size
                        for p in (reg.storage / "docker/registry/v2/blobs").rglob("data"))
    module_sizes = [p.stat().st_size for p in built.drivers.glob("*.ko")]
    assert all(size in blob_sizes for size in module_sizes)  # every module, as built
    assert sum(module_sizes) > 120 * 10**6  # NVIDIA's real modules, not the kit's
    assert PASSWORD not in pushed.stdout + pushed.stderr

    node = tmp_path_factory.mktemp("real-node") / "host"
    make_debian_host(node, headers=False)  # no headers: only the artifact can do it
    node_env = env_for(node, kernel, run, "proprietary", **registry_settings(repository),
                       NVIDIA_MODULE_TRUSTED_KEYS=str(public))
    result = ok(run_installer_niced(node_env, "run", timeout=900))
    assert "using prebuilt modules" in result.stderr
    assert "step build-modules: already satisfied" in result.stderr
    assert not (install_dir(node) / "nvidia-installer-build.log").exists()
    drivers = install_dir(node) / "drivers"
    names = sorted(p.name for p in drivers.glob("*.ko"))
    assert names == sorted(p.name for p in built.drivers.glob("*.ko"))
    for name in names:
        assert same_bytes(drivers / name, built.drivers / name), name
    assert modinfo(drivers / "nvidia.ko", "version") == VERSION
    host_ko = node / "lib/modules" / kernel / "updates/nvidia-driver-installer/nvidia.ko"
    assert same_bytes(host_ko, built.drivers / "nvidia.ko")
