"""Module artifacts against a real registry (docker-registry on 127.0.0.1): push, pull,
missing, wrong key, corrupted blob, registry down, auth required."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from registrykit import PASSWORD, USER, Registry

from installer.delivery import registry
from installer.delivery.registry import ArtifactKey, RegistrySettings
from installer.errors import ArtifactInvalid, RegistryAuthFailed, RegistryUnavailable

KEY = ArtifactKey("580.95.05", "6.1.0-26-amd64", "open", "x86_64")


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    server = Registry(tmp_path_factory.mktemp("registry")).start()
    yield server
    server.stop()


@pytest.fixture
def settings(reg: Registry, request: pytest.FixtureRequest) -> RegistrySettings:
    # One repository per test: tests do not see each other's artifacts.
    name = "nvidia/" + request.node.name.lower().replace("_", "-")[:60]
    return RegistrySettings(reg.repository(name), plain_http=True, username=USER,
                            password=PASSWORD)


@pytest.fixture
def modules(tmp_path: Path) -> list[Path]:
    built = tmp_path / "built"
    built.mkdir()
    files = []
    for name, size in (("nvidia.ko", 200_000), ("nvidia-uvm.ko", 3000), ("nvidia-modeset.ko", 10)):
        path = built / name
        path.write_bytes(os.urandom(size))
        files.append(path)
    return files


def test_push_then_find_and_pull_by_digest(
    settings: RegistrySettings, modules: list[Path], tmp_path: Path
) -> None:
    assert registry.find(settings, KEY) is None

    pushed = registry.push(settings, KEY, modules)
    found = registry.find(settings, KEY)

    assert found is not None and found.digest == pushed.digest
    assert found.reference == f"{settings.repository}@{pushed.digest}"
    dest = tmp_path / "pulled"
    dest.mkdir()
    pulled = registry.pull(settings, found, dest)
    assert sorted(p.name for p in pulled) == sorted(p.name for p in modules)
    for path in modules:
        assert (dest / path.name).read_bytes() == path.read_bytes()
    names = {name: sha for name, sha, _ in found.files}
    assert names["nvidia.ko"] == hashlib.sha256(modules[0].read_bytes()).hexdigest()


def test_an_artifact_of_another_key_is_not_found(
    settings: RegistrySettings, modules: list[Path]
) -> None:
    registry.push(settings, KEY, modules)
    for other in (
        replace(KEY, signing=registry.signing_identity(b"another certificate")),
        replace(KEY, kernel="6.1.0-27-amd64"),
        replace(KEY, flavour="proprietary"),
        replace(KEY, version="580.95.06"),
    ):
        assert registry.find(settings, other) is None


def test_a_tag_whose_config_names_another_key_is_refused(
    settings: RegistrySettings, modules: list[Path]
) -> None:
    signed = replace(KEY, signing=registry.signing_identity(b"cert A"))
    registry.push(settings, signed, modules)
    # The same tag carrying a different key's config (a hand-pushed or colliding tag).
    lookalike = replace(signed, signing=registry.signing_identity(b"cert A") + "0")
    assert lookalike.tag() == signed.tag()
    assert registry.find(settings, lookalike) is None


def test_a_corrupted_blob_fails_verification(
    reg: Registry, settings: RegistrySettings, modules: list[Path], tmp_path: Path
) -> None:
    registry.push(settings, KEY, modules)
    found = registry.find(settings, KEY)
    assert found is not None
    digest = next(sha for name, sha, _ in found.files if name == "nvidia.ko")
    blob = reg.blob_path("sha256:" + digest)
    damaged = bytearray(blob.read_bytes())
    damaged[1000] ^= 0xFF  # same size, one bit pattern changed on the registry's disk
    blob.write_bytes(bytes(damaged))
    dest = tmp_path / "pulled"
    dest.mkdir()

    with pytest.raises(ArtifactInvalid) as info:
        registry.pull(settings, found, dest)

    assert info.value.exit_code == 77 and "nvidia.ko" in info.value.message
    assert digest in info.value.message


def test_a_registry_that_is_down_is_unavailable(modules: list[Path], tmp_path: Path) -> None:
    dead = Registry(tmp_path / "dead")  # never started: its port refuses connections
    settings = RegistrySettings(dead.repository("nvidia/x"), plain_http=True)

    with pytest.raises(RegistryUnavailable) as info:
        registry.find(settings, KEY)
    assert type(info.value) is RegistryUnavailable and info.value.exit_code == 75
    with pytest.raises(RegistryUnavailable):
        registry.push(settings, KEY, modules)


def test_auth_required_and_wrong_password(
    settings: RegistrySettings, modules: list[Path]
) -> None:
    for bad in (replace(settings, username=None, password=None),
                replace(settings, password="wrong")):
        with pytest.raises(RegistryAuthFailed) as info:
            registry.find(settings=bad, key=KEY)
        assert info.value.exit_code == 76
        assert PASSWORD not in info.value.message
        with pytest.raises(RegistryAuthFailed):
            registry.push(bad, KEY, modules)
