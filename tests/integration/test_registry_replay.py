"""Replayed signatures against a real registry (docker-registry on 127.0.0.1): a signed build is
vouched for only where it was signed and for the key it was built for. An older version's
signed artifact re-tagged under a newer version's tag, and a staging build copied with its
`.sig` into the production repository, are refused and the node compiles; a build promoted by
re-signing it for production is used."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import kit
import pytest
import requests
from lib.hostkit import (
    INSTALL_DIR_HOST,
    debian_headers,
    installer_env,
    make_debian_host,
    run_installer,
)
from lib.httpfaults import serve_directory
from lib.registrykit import PASSWORD, USER, Registry, http_push, make_key_pair

from installer.delivery import registry, trust
from installer.delivery.artifact import ArtifactKey, Policy
from installer.errors import ArtifactInvalid, ArtifactUntrusted

OLD = ArtifactKey("580.95.05", "6.1.0-26-amd64", "open", "x86_64")
NEW = replace(OLD, version="580.95.06")
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    server = Registry(tmp_path_factory.mktemp("registry")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_key_pair(tmp_path_factory.mktemp("keys"), "builder")


@pytest.fixture
def policy(keys: tuple[Path, Path]) -> Policy:
    return Policy(trust.load_trust_root(keys[1]))


@pytest.fixture
def modules(tmp_path: Path) -> list[Path]:
    built = tmp_path / "built"
    built.mkdir()
    for name, size in (("nvidia.ko", 50_000), ("nvidia-uvm.ko", 3000)):
        (built / name).write_bytes(os.urandom(size))
    return sorted(built.glob("*.ko"))


def copy(reg: Registry, source: str, reference: str, dest: str, tag: str) -> str:
    """What anyone with push credentials can do: the manifest at `source:reference` and every
    blob it names, pushed unchanged to `dest:tag`. Returns the manifest digest."""
    base = f"http://{reg.host}/v2"
    with requests.Session() as session:
        session.auth = (USER, PASSWORD)
        got = session.get(f"{base}/{source}/manifests/{reference}", headers={"Accept": MANIFEST},
                          timeout=30)
        assert got.status_code == 200, got.text
        document = got.json()
        blobs = []
        for desc in [document["config"], *document["layers"]]:
            blob = session.get(f"{base}/{source}/blobs/{desc['digest']}", timeout=30)
            assert blob.status_code == 200
            blobs.append(blob.content)
    host, name = reg.repository(dest).split("/", 1)
    return http_push(host, name, tag, blobs, got.content)


def test_an_older_signed_build_retagged_as_a_newer_version_is_refused(
        reg: Registry, modules: list[Path], keys: tuple[Path, Path], policy: Policy) -> None:
    settings = reg.settings("fleet/retag")
    old = registry.push(settings, OLD, modules, trust.load_signer(keys[0]))

    retagged = copy(reg, "fleet/retag", OLD.tag(), "fleet/retag", NEW.tag())

    assert retagged == old.digest  # the same bytes, the builder's signature still over them
    with pytest.raises(ArtifactInvalid) as info:
        registry.find(settings, NEW, policy)
    assert "580.95.05" in info.value.message and "580.95.06" in info.value.message
    assert old.digest in info.value.message
    assert info.value.exit_code == 77
    assert registry.find(settings, OLD, policy) is not None  # where it belongs, it is used


def test_a_staging_build_copied_with_its_signature_into_production_is_refused(
        reg: Registry, modules: list[Path], keys: tuple[Path, Path], policy: Policy) -> None:
    staging, production = reg.settings("staging/m"), reg.settings("production/m")
    built = registry.push(staging, NEW, modules, trust.load_signer(keys[0]))
    assert registry.find(staging, NEW, policy) is not None

    copy(reg, "staging/m", NEW.tag(), "production/m", NEW.tag())
    copy(reg, "staging/m", trust.signature_tag(built.digest), "production/m",
         trust.signature_tag(built.digest))

    with pytest.raises(ArtifactUntrusted) as info:
        registry.find(production, NEW, policy)
    assert f"names {staging.repository}, not {production.repository}" in info.value.message
    assert info.value.exit_code == 85

    # Promotion: the builder signs the same digest for production (what `installer prebuild
    # --push` against production, or `cosign sign --key` on the copied digest, does).
    promoted = registry.push(production, NEW, modules, trust.load_signer(keys[0]))
    assert promoted.digest == built.digest
    found = registry.find(production, NEW, policy)
    assert found is not None and found.reference == f"{production.repository}@{built.digest}"


def test_payloads_name_the_repository_as_cosign_writes_it() -> None:
    digest = "sha256:" + "ab" * 32
    signed = trust.payload("ghcr.io/org/modules", digest)
    assert trust.signed_digest(signed) == digest
    assert trust.signed_repository(signed) == "ghcr.io/org/modules"
    assert trust.names_repository(signed, "ghcr.io/org/modules")
    assert trust.names_repository(signed, "GHCR.io/org/modules")  # host names ignore case
    assert not trust.names_repository(signed, "ghcr.io/org/modules-staging")
    assert not trust.names_repository(signed, "ghcr.io/org")
    hub = trust.payload("index.docker.io/org/modules", digest)  # cosign's name for Docker Hub
    assert trust.names_repository(hub, "docker.io/org/modules")
    tagged = trust.payload("ghcr.io/org/modules:580", digest)  # older cosign kept the tag
    assert trust.names_repository(tagged, "ghcr.io/org/modules")
    assert not trust.names_repository(b'{"critical": {}}', "ghcr.io/org/modules")


# --------------------------------------------------------------------------- end to end

A = "580.105.08"


@pytest.mark.skipif(debian_headers() is None, reason="needs linux-headers-amd64")
def test_a_node_compiles_rather_than_use_a_staging_build_copied_into_production(
        tmp_path: Path, reg: Registry, keys: tuple[Path, Path]) -> None:
    www = tmp_path / "www"
    kit.build_runfile(A, www / A)
    digests = kit.write_digests(tmp_path / "digests", www)
    with serve_directory(www) as (base, _requests):
        builder = tmp_path / "builder"
        kernel = make_debian_host(builder, gpus=())

        def env(root: Path, name: str, **extra: str) -> dict[str, str]:
            return installer_env(
                root, kernel, NVIDIA_DRIVER_VERSION=A, NVIDIA_DRIVER_MIRRORS=base,
                NVIDIA_DRIVER_DIGESTS_FILE=str(digests),
                NVIDIA_MODULE_REGISTRY=reg.repository(name),
                NVIDIA_MODULE_REGISTRY_PLAIN_HTTP="true", NVIDIA_MODULE_REGISTRY_USERNAME=USER,
                NVIDIA_MODULE_REGISTRY_PASSWORD=PASSWORD, **extra)

        staged = env(builder, "e2e-staging/m", NVIDIA_MODULE_PUBLISHER_KEY=str(keys[0]))
        del staged["NVIDIA_KERNEL_RELEASE"]
        pushed = run_installer(staged, "prebuild", "--kernel", kernel, "--push")
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        digest = pushed.stdout.strip().split("@", 1)[1]
        tag = ArtifactKey(A, kernel, "open", "x86_64").tag()
        copy(reg, "e2e-staging/m", tag, "e2e-production/m", tag)
        copy(reg, "e2e-staging/m", trust.signature_tag(digest), "e2e-production/m",
             trust.signature_tag(digest))

        node = tmp_path / "node"
        make_debian_host(node)
        result = run_installer(env(node, "e2e-production/m",
                                   NVIDIA_MODULE_TRUSTED_KEYS=str(keys[1])), "run")

    assert result.returncode == 0, result.stderr[-3000:]
    assert "prebuilt-modules = untrusted" in result.stderr
    assert "error[artifact-untrusted]" in result.stderr
    assert f"names {reg.repository('e2e-staging/m')}, not" in result.stderr
    assert "step build-modules: done" in result.stderr
    assert "using prebuilt modules" not in result.stderr
    assert (node / INSTALL_DIR_HOST.lstrip("/") / "drivers" / "nvidia.ko").is_file()
