"""The second node of a kernel needs no .run: node A compiles and publishes the modules and the
user space (signed, version and architecture scoped) to a real registry (docker-registry on
127.0.0.1); node B, with no headers, installs both from the registry and never asks the mirror
for the .run. A tampered, unsigned or misplaced user-space artifact is refused and the .run
installs the user space as before."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kit
import pytest
from lib.hostkit import (
    INSTALL_DIR_HOST,
    debian_headers,
    installer_env,
    make_debian_host,
    ok,
    run_installer,
)
from lib.httpfaults import serve_directory
from lib.registrykit import PASSWORD, USER, Registry, http_push, make_key_pair

from installer.delivery.oci import RegistrySettings

pytestmark = pytest.mark.skipif(debian_headers() is None, reason="needs linux-headers-amd64")

A = "580.105.08"
OTHER = "580.95.05"


@dataclass
class Served:
    base: str
    requests: list[str]
    digests: Path  # what vouches for the mirror's .run (a plain-http mirror's checksum does not)

    def runfile_requests(self, since: int) -> list[str]:
        return [p for p in self.requests[since:] if ".run" in p]


@dataclass
class NodeA:
    root: Path
    kernel: str
    repository: str
    stderr: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    www = tmp_path_factory.mktemp("www")
    kit.build_runfile(A, www / A)
    digests = kit.write_digests(www.parent / f"{www.name}.digests", www)
    with serve_directory(www) as (base, requests):
        yield Served(base, requests, digests)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    where = tmp_path_factory.mktemp("keys")
    return {"builder": make_key_pair(where, "builder"), "other": make_key_pair(where, "other")}


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    server = Registry(tmp_path_factory.mktemp("registry")).start()
    yield server
    server.stop()


def node_env(root: Path, kernel: str, served: Served, repository: str,
             **extra: str) -> dict[str, str]:
    return installer_env(
        root, kernel, NVIDIA_DRIVER_VERSION=A, NVIDIA_DRIVER_MIRRORS=served.base,
        NVIDIA_DRIVER_DIGESTS_FILE=str(served.digests),
        NVIDIA_MODULE_REGISTRY=repository, NVIDIA_MODULE_REGISTRY_PLAIN_HTTP="true",
        NVIDIA_MODULE_REGISTRY_USERNAME=USER, NVIDIA_MODULE_REGISTRY_PASSWORD=PASSWORD, **extra,
    )



def version_dir(root: Path) -> Path:
    return root / INSTALL_DIR_HOST.lstrip("/") / "versions" / A


def tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every path of versions/<A> but the installer's own top-level dot-files: (kind, mode,
    SHA-256 of a file's bytes or a link's target)."""
    top = version_dir(root)
    found = {}
    for directory, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(directory, name)
            rel = str(path.relative_to(top))
            if "/" not in rel and rel.startswith("."):
                continue
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", stat.S_IMODE(info.st_mode), "")
            else:
                found[rel] = ("file", stat.S_IMODE(info.st_mode),
                              hashlib.sha256(path.read_bytes()).hexdigest())
    return found


@pytest.fixture(scope="module")
def node_a(tmp_path_factory: pytest.TempPathFactory, served: Served, reg: Registry,
           keys: dict[str, tuple[Path, Path]]) -> NodeA:
    repository = reg.repository("gpu/nvidia")
    private, public = keys["builder"]
    root = tmp_path_factory.mktemp("node-a") / "host"
    kernel = make_debian_host(root)
    first = ok(run_installer(node_env(root, kernel, served, repository,
                                      NVIDIA_MODULE_REGISTRY_PUSH="true",
                                      NVIDIA_MODULE_PUBLISHER_KEY=str(private),
                                      NVIDIA_MODULE_TRUSTED_KEYS=str(public)), "run"))
    return NodeA(root, kernel, repository, first.stderr)


def test_node_b_installs_modules_and_user_space_without_the_run(
    tmp_path: Path, served: Served, node_a: NodeA, keys: dict[str, tuple[Path, Path]]
) -> None:
    assert "step install-userspace: done" in node_a.stderr
    assert f"published the user space {node_a.repository}:{A}-userspace-x86_64" in node_a.stderr
    assert "step publish-userspace: done" in node_a.stderr
    root = tmp_path / "b"
    make_debian_host(root, headers=False)
    env = node_env(root, node_a.kernel, served, node_a.repository,
                   NVIDIA_MODULE_TRUSTED_KEYS=str(keys["builder"][1]))
    plan = ok(run_installer(env, "plan"))
    assert f"userspace: {node_a.repository}@sha256:" in plan.stdout
    assert "because signed by sha256:" in plan.stdout
    before = len(served.requests)

    result = ok(run_installer(env, "run"))

    assert served.runfile_requests(before) == []  # not one request for the .run
    assert "installed the user space of " + A in result.stderr
    assert "step fetch-runfile: already satisfied" in result.stderr
    assert "step extract-runfile: already satisfied" in result.stderr
    assert "step install-userspace: already satisfied" in result.stderr
    assert not (root / "var/cache/nvidia-installer").exists() or not any(
        (root / "var/cache/nvidia-installer").rglob("*.run"))
    b_tree, a_tree = tree(root), tree(node_a.root)
    assert b_tree == a_tree and len(a_tree) > 5
    assert any(kind == "link" for kind, _, _ in a_tree.values())  # soname links came along
    assert (version_dir(root) / ".complete").read_text() == f"{A}\n"
    listing = json.loads((version_dir(root) / ".userspace-files").read_text())
    assert listing == json.loads((version_dir(node_a.root) / ".userspace-files").read_text())
    # The host's ld cache finds the pulled libraries through their soname links.
    cached = subprocess.run(["ldconfig", "-r", str(root), "-p"], capture_output=True, text=True,
                            check=True).stdout
    assert f"libnvidia-ml.so.1 (libc6,x86-64) => {INSTALL_DIR_HOST}/lib64/libnvidia-ml.so.1" \
        in cached
    assert cached == subprocess.run(["ldconfig", "-r", str(node_a.root), "-p"],
                                    capture_output=True, text=True, check=True).stdout
    # Warm: nothing is asked of the registry or the mirror again.
    again = ok(run_installer(env, "run"))
    assert "step pull-userspace: already satisfied" in again.stderr


def _publish_modules(node: NodeA, repository: str, private: Path) -> None:
    """The genuine modules of node A, signed, in `repository` (so node B pulls them)."""
    from installer.delivery import registry, trust
    from installer.delivery.artifact import ArtifactKey

    (built,) = (node.root / INSTALL_DIR_HOST.lstrip("/") / "cache/modules").rglob("nvidia.ko")
    settings = RegistrySettings(repository, plain_http=True, username=USER, password=PASSWORD)
    key = ArtifactKey(A, node.kernel, built.parent.name, "x86_64")
    registry.push(settings, key, sorted(built.parent.glob("*.ko")), trust.load_signer(private))


def _settings(repository: str) -> RegistrySettings:
    return RegistrySettings(repository, plain_http=True, username=USER, password=PASSWORD)


def _falls_back(tmp_path: Path, served: Served, node: NodeA, repository: str, public: Path,
                refusal: str, **extra: str) -> subprocess.CompletedProcess[str]:
    root = tmp_path / "node"
    make_debian_host(root, headers=False)
    env = node_env(root, node.kernel, served, repository,
                   NVIDIA_MODULE_TRUSTED_KEYS=str(public), **extra)
    before = len(served.requests)
    result = ok(run_installer(env, "run"))
    assert "using prebuilt modules" in result.stderr
    assert f"user space not pulled (error[{refusal}]" in result.stderr
    assert "installing it from the .run" in result.stderr
    assert "step install-userspace: done" in result.stderr
    assert served.runfile_requests(before)  # the .run did the job
    # The genuine user space, nothing of the forgery (the kit's record of what its installer
    # placed names each node's own staging path).
    record = "share/nvidia/nvidia-installer.files.json"
    assert {k: v for k, v in tree(root).items() if k != record} == {
        k: v for k, v in tree(node.root).items() if k != record}
    assert not (version_dir(root) / ".userspace-artifact").exists()
    return result


def test_a_tampered_layer_is_refused_while_it_streams_and_the_run_is_used(
    tmp_path: Path, served: Served, reg: Registry, node_a: NodeA,
    keys: dict[str, tuple[Path, Path]]
) -> None:
    from installer.delivery import userspace_artifact
    from installer.delivery.trust import load_signer

    private, public = keys["builder"]
    repository = reg.repository("tamper/nvidia")
    _publish_modules(node_a, repository, private)
    listing = json.loads((version_dir(node_a.root) / ".userspace-files").read_text())
    pushed = userspace_artifact.push(_settings(repository),
                                     userspace_artifact.UserspaceKey(A, "x86_64"),
                                     version_dir(node_a.root), listing, load_signer(private))
    # The registry's storage is changed under the signed manifest: same digest, other bytes.
    blob = reg.blob_path(pushed.layer[0])
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))

    # NVIDIA_MODULE_REQUIRE_PREBUILT is about compiling: the .run's user space compiles nothing.
    _falls_back(tmp_path, served, node_a, repository, public, "artifact-invalid",
                NVIDIA_MODULE_REQUIRE_PREBUILT="true")


def test_a_forged_unsigned_or_misplaced_user_space_is_refused(
    tmp_path: Path, served: Served, reg: Registry, node_a: NodeA,
    keys: dict[str, tuple[Path, Path]]
) -> None:
    from installer.delivery import userspace_artifact
    from installer.delivery.trust import load_signer
    from installer.delivery.userspace_tar import pack, scan

    private, public = keys["builder"]
    source = version_dir(node_a.root)
    paths = json.loads((source / ".userspace-files").read_text())

    # Someone with push credentials but no key: a tampered nvidia-smi under a forged manifest.
    forged_tree = tmp_path / "forged"
    subprocess.run(["cp", "-a", str(source), str(forged_tree)], check=True)
    smi = next(p for p in paths if p.endswith("nvidia-smi"))
    (forged_tree / smi).write_bytes(b"#!/bin/sh\necho pwned\n")
    key = userspace_artifact.UserspaceKey(A, "x86_64")
    entries = scan(forged_tree, paths)
    layer = pack(forged_tree, entries)
    config = userspace_artifact.config_for(key, entries)
    manifest = userspace_artifact.manifest_for(config, layer, key)
    unsigned = reg.repository("unsigned/nvidia")
    _publish_modules(node_a, unsigned, private)
    host, name = unsigned.split("/", 1)
    http_push(host, name, key.tag(), [layer, config], manifest)
    _falls_back(tmp_path / "u", served, node_a, unsigned, public, "artifact-untrusted")
    # A publisher is not kept out by a forgery squatting on the tag: it publishes over it.
    signer = load_signer(private)
    assert not userspace_artifact.published(_settings(unsigned), key, signer)
    userspace_artifact.push(_settings(unsigned), key, source, paths, signer)
    assert userspace_artifact.published(_settings(unsigned), key, signer)

    def retagged(name: str, genuine: userspace_artifact.UserspaceKey) -> str:
        """A repository where the user space of `genuine`, signed, stands under key's tag."""
        repository = reg.repository(name)
        _publish_modules(node_a, repository, private)
        pushed = userspace_artifact.push(_settings(repository), genuine, source, paths,
                                         load_signer(private))
        host, path = repository.split("/", 1)
        http_push(host, path, key.tag(), [], pushed.evidence.manifest)
        return repository

    # A genuine, signed user space of another version re-tagged as this version's.
    misplaced = retagged("misplaced/nvidia", userspace_artifact.UserspaceKey(OTHER, "x86_64"))
    result = _falls_back(tmp_path / "m", served, node_a, misplaced, public, "artifact-invalid")
    assert f"holds the user space of {{'arch': 'x86_64', 'content': 'userspace', 'version': " \
           f"'{OTHER}'}}" in result.stderr

    # And another architecture's, the same way.
    arm = retagged("arm/nvidia", userspace_artifact.UserspaceKey(A, "aarch64"))
    _falls_back(tmp_path / "arm", served, node_a, arm, public, "artifact-invalid")


def test_prebuild_push_publishes_the_user_space_too(
    tmp_path: Path, served: Served, reg: Registry, keys: dict[str, tuple[Path, Path]]
) -> None:
    private, public = keys["builder"]
    repository = reg.repository("ci/nvidia")
    builder = tmp_path / "builder"
    kernel = make_debian_host(builder, gpus=())
    env = node_env(builder, kernel, served, repository,
                   NVIDIA_MODULE_PUBLISHER_KEY=str(private))
    env.pop("NVIDIA_KERNEL_RELEASE")

    pushed = ok(run_installer(env, "prebuild", "--kernel", kernel, "--push"))

    assert pushed.stdout.strip().startswith(f"{repository}@sha256:")  # the modules, as before
    assert f"published the user space {repository}:{A}-userspace-x86_64" in pushed.stderr
    assert not version_dir(builder).exists()  # placed in a scratch directory, not installed
    again = ok(run_installer(env, "prebuild", "--kernel", kernel, "--push"))
    assert "has the user space" in again.stderr and "already: not published again" in again.stderr

    node = tmp_path / "node"
    make_debian_host(node, headers=False)
    before = len(served.requests)
    ok(run_installer(node_env(node, kernel, served, repository,
                              NVIDIA_MODULE_TRUSTED_KEYS=str(public),
                              NVIDIA_MODULE_REQUIRE_PREBUILT="true"), "run"))
    assert served.runfile_requests(before) == []
    assert (version_dir(node) / "lib64" / f"libnvidia-ml.so.{A}").is_file()
