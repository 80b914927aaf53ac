"""Module artifacts against a real registry (docker-registry on 127.0.0.1): push and sign, find
and pull by digest, and everything a node refuses: unsigned, signed by another key, a signature
lifted from another digest, unpinned, other module names, oversize, a corrupted blob, a registry
that is down or asks for credentials. Stand-in registries on 127.0.0.1 play the token flows
and a 300 MB manifest that docker-registry would not store."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from lib.httpfaults import QuietHandler, answer
from lib.registrykit import PASSWORD, USER, Registry, http_push, make_key_pair

from installer.delivery import artifact, registry, trust
from installer.delivery.artifact import ArtifactKey, ModuleFile, Policy
from installer.delivery.oci import RegistrySettings
from installer.errors import (
    ArtifactInvalid,
    ArtifactUntrusted,
    RegistryAuthFailed,
    RegistryRealmRefused,
    RegistryUnavailable,
    TrustRootInvalid,
)

KEY = ArtifactKey("580.95.05", "6.1.0-26-amd64", "open", "x86_64")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    where = tmp_path_factory.mktemp("keys")
    return {"builder": make_key_pair(where, "builder"), "other": make_key_pair(where, "other")}


@pytest.fixture
def signer(keys: dict[str, tuple[Path, Path]]) -> trust.Signer:
    return trust.load_signer(keys["builder"][0])


@pytest.fixture
def policy(keys: dict[str, tuple[Path, Path]]) -> Policy:
    return Policy(trust.load_trust_root(keys["builder"][1]))


@pytest.fixture
def settings(reg: Registry, request: pytest.FixtureRequest) -> RegistrySettings:
    # One repository per test: tests do not see each other's artifacts.
    name = "nvidia/" + request.node.name.lower().replace("_", "-")[:60]
    return reg.settings(name)


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


def _forge(settings: RegistrySettings, key: ArtifactKey, files: dict[str, bytes],
           tag: str | None = None) -> tuple[bytes, str]:
    """What an attacker with push credentials and no key can publish: a well-formed artifact
    at the key's tag, through the HTTP API. Returns (manifest, digest)."""
    entries = [ModuleFile(n, hashlib.sha256(b).hexdigest(), len(b)) for n, b in files.items()]
    config = artifact.config_for(key, entries)
    manifest = artifact.manifest_for(config, entries, key)
    host, name = settings.repository.split("/", 1)
    digest = http_push(host, name, tag or key.tag(), [*files.values(), config], manifest)
    return manifest, digest


def _sign_by_hand(settings: RegistrySettings, digest: str, private: Path,
                  payload: bytes | None = None) -> None:
    """A cosign signature for `digest` (or over `payload`) pushed through the HTTP API."""
    payload = payload or trust.payload(settings.repository, digest)
    signature = trust.load_signer(private).sign(payload)
    config = trust.signature_config("sha256:" + hashlib.sha256(payload).hexdigest())
    host, name = settings.repository.split("/", 1)
    http_push(host, name, trust.signature_tag(digest), [payload, config],
              artifact.signature_manifest(None, payload, signature, config))


def test_push_signs_in_cosigns_shapes_and_a_node_finds_and_pulls_by_digest(
    reg: Registry, settings: RegistrySettings, modules: list[Path], signer: trust.Signer,
    policy: Policy, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    assert registry.find(settings, KEY, policy) is None

    pushed = registry.push(settings, KEY, modules, signer)
    found = registry.find(settings, KEY, policy)

    assert found is not None and found.digest == pushed.digest
    assert found.reference == f"{settings.repository}@{pushed.digest}"
    assert found.signer == signer.fingerprint()
    dest = tmp_path / "pulled"
    dest.mkdir()
    pulled = registry.pull(settings, found, dest)
    assert sorted(p.name for p in pulled) == sorted(p.name for p in modules)
    for path in modules:
        assert (dest / path.name).read_bytes() == path.read_bytes()

    # cosign's layout, checked with nothing of ours: the tag, the layer, the annotation, the
    # payload byte for byte, and an ECDSA-SHA256 signature over it by the builder's key.
    import requests
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    host, name = settings.repository.split("/", 1)
    sig_tag = "sha256-" + pushed.digest.split(":")[1] + ".sig"
    got = requests.get(f"http://{host}/v2/{name}/manifests/{sig_tag}", auth=(USER, PASSWORD),
                       headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
                       timeout=10)
    assert got.status_code == 200
    sig_manifest = got.json()
    assert sig_manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    (layer,) = sig_manifest["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    payload = requests.get(f"http://{host}/v2/{name}/blobs/{layer['digest']}",
                           auth=(USER, PASSWORD), timeout=10).content
    assert json.loads(payload) == {
        "critical": {"identity": {"docker-reference": settings.repository},
                     "image": {"docker-manifest-digest": pushed.digest},
                     "type": "cosign container image signature"},
        "optional": None}
    assert payload.startswith(b'{"critical":{"identity":{"docker-reference":"')
    public = serialization.load_pem_public_key(keys["builder"][1].read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"]),
                  payload, ec.ECDSA(hashes.SHA256()))  # raises if it does not verify


def test_an_unsigned_artifact_pushed_over_the_http_api_is_untrusted(
    settings: RegistrySettings, policy: Policy
) -> None:
    _forge(settings, KEY, {"nvidia.ko": b"forged"})
    with pytest.raises(ArtifactUntrusted, match="has no cosign signature") as info:
        registry.find(settings, KEY, policy)
    assert info.value.exit_code == 85


def test_a_signature_by_a_key_not_trusted_is_untrusted(
    settings: RegistrySettings, policy: Policy, keys: dict[str, tuple[Path, Path]]
) -> None:
    _, digest = _forge(settings, KEY, {"nvidia.ko": b"forged"})
    _sign_by_hand(settings, digest, keys["other"][0])
    with pytest.raises(ArtifactUntrusted, match="none of the 1 signature"):
        registry.find(settings, KEY, policy)


def test_a_valid_signature_lifted_onto_another_digest_is_untrusted(
    settings: RegistrySettings, policy: Policy, modules: list[Path], signer: trust.Signer,
    keys: dict[str, tuple[Path, Path]]
) -> None:
    good = registry.push(settings, KEY, modules, signer)
    _, forged = _forge(settings, KEY, {"nvidia.ko": b"forged"})
    # The builder's real payload and signature (they name the good digest), under the forgery.
    _sign_by_hand(settings, forged, keys["builder"][0],
                  payload=trust.payload(settings.repository, good.digest))
    with pytest.raises(ArtifactUntrusted, match=forged):
        registry.find(settings, KEY, policy)


def test_pinned_digests_narrow_what_is_used(
    settings: RegistrySettings, policy: Policy, modules: list[Path], signer: trust.Signer
) -> None:
    pushed = registry.push(settings, KEY, modules, signer)
    with pytest.raises(ArtifactUntrusted, match="not one of the digests pinned"):
        registry.find(settings, KEY, replace(policy, digests=("sha256:" + "0" * 64,)))
    found = registry.find(settings, KEY, replace(policy, digests=(pushed.digest,)))
    assert found is not None and found.digest == pushed.digest


def test_a_signed_artifact_with_another_module_name_is_refused(
    settings: RegistrySettings, policy: Policy, keys: dict[str, tuple[Path, Path]],
    modules: list[Path], signer: trust.Signer
) -> None:
    _, digest = _forge(settings, KEY, {"nvidia.ko": b"a", "overlay.ko": b"b"})
    _sign_by_hand(settings, digest, keys["builder"][0])  # even the builder's key cannot
    with pytest.raises(ArtifactInvalid, match=r"'overlay\.ko' is not one of NVIDIA's modules"):
        registry.find(settings, KEY, policy)
    (modules[0].parent / "overlay.ko").write_bytes(b"x")
    with pytest.raises(ArtifactInvalid, match=r"overlay\.ko"):  # and the builder refuses too
        registry.push(settings, KEY, [*modules, modules[0].parent / "overlay.ko"], signer)


def test_an_artifact_of_another_key_is_not_found(
    settings: RegistrySettings, modules: list[Path], signer: trust.Signer, policy: Policy
) -> None:
    registry.push(settings, KEY, modules, signer)
    for other in (
        replace(KEY, signing=artifact.signing_identity(b"another certificate")),
        replace(KEY, kernel="6.1.0-27-amd64"),
        replace(KEY, flavour="proprietary"),
        replace(KEY, version="580.95.06"),
    ):
        assert registry.find(settings, other, policy) is None
    # The same tag carrying a different key's config (a hand-pushed or colliding tag): the
    # signed config, not the tag, says what the build is for.
    signed = replace(KEY, signing=artifact.signing_identity(b"cert A"))
    registry.push(settings, signed, modules, signer)
    lookalike = replace(signed, signing=artifact.signing_identity(b"cert A") + "0")
    assert lookalike.tag() == signed.tag()
    with pytest.raises(ArtifactInvalid, match=r"not used \(a build re-tagged\)"):
        registry.find(settings, lookalike, policy)


def test_a_corrupted_blob_fails_verification(
    reg: Registry, settings: RegistrySettings, modules: list[Path], signer: trust.Signer,
    policy: Policy, tmp_path: Path
) -> None:
    registry.push(settings, KEY, modules, signer)
    found = registry.find(settings, KEY, policy)
    assert found is not None
    digest = next(f.sha256 for f in found.files if f.name == "nvidia.ko")
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


def test_a_registry_that_is_down_is_unavailable(
    modules: list[Path], tmp_path: Path, signer: trust.Signer, policy: Policy
) -> None:
    dead = Registry(tmp_path / "dead")  # never started: its port refuses connections
    settings = RegistrySettings(dead.repository("nvidia/x"), plain_http=True)

    with pytest.raises(RegistryUnavailable) as info:
        registry.find(settings, KEY, policy)
    assert type(info.value) is RegistryUnavailable and info.value.exit_code == 75
    with pytest.raises(RegistryUnavailable):
        registry.push(settings, KEY, modules, signer)


def test_auth_required_and_wrong_password(
    settings: RegistrySettings, modules: list[Path], signer: trust.Signer, policy: Policy
) -> None:
    for bad in (replace(settings, username=None, password=None),
                replace(settings, password="wrong")):
        with pytest.raises(RegistryAuthFailed) as info:
            registry.find(bad, KEY, policy)
        assert info.value.exit_code == 76
        assert PASSWORD not in info.value.message
        with pytest.raises(RegistryAuthFailed):
            registry.push(bad, KEY, modules, signer)


def test_keys_that_are_not_keys_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "empty.pem").write_text("nothing here\n")
    with pytest.raises(TrustRootInvalid, match="no PEM public key or certificate"):
        trust.load_trust_root(tmp_path / "empty.pem")
    with pytest.raises(TrustRootInvalid, match="No such file"):
        trust.load_trust_root(tmp_path / "missing.pub")
    (tmp_path / "cosign.key").write_text("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n"
                                         "eyJ9\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    with pytest.raises(TrustRootInvalid, match="cosign's own encrypted format") as info:
        trust.load_signer(tmp_path / "cosign.key")
    assert "cosign import-key-pair" in info.value.hint


# --------------------------------------------------------------------------- stand-ins


class _Stub(ThreadingHTTPServer):
    daemon_threads = True
    seen: list[tuple[str, str, str]]  # (method, path, Authorization)
    handle_fn: Any


class _Handler(QuietHandler):
    server: _Stub

    def do_GET(self) -> None:
        self.server.seen.append(("GET", self.path, self.headers.get("Authorization", "")))
        self.server.handle_fn(self)

    do_HEAD = do_GET


@contextmanager
def _serve(handle: Any) -> Iterator[_Stub]:
    server = _Stub(("127.0.0.1", 0), _Handler)
    server.seen = []
    server.handle_fn = handle
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def realm() -> Iterator[_Stub]:
    with _serve(lambda h: answer(h, 200, b'{"token": "t"}')) as server:
        yield server


def _bearer_registry(realm_url: str, token_seen: list[str]) -> Any:
    def handle(h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/token"):
            token_seen.append(h.headers.get("Authorization", ""))
            answer(h, 200, b'{"token": "good"}')
        elif h.headers.get("Authorization") == "Bearer good":
            answer(h, 404 if "/manifests/" in h.path else 200, b"{}")
        else:
            answer(h, 401, headers={"WWW-Authenticate": f'Bearer realm="{realm_url}",'
                                     'service="registry",scope="repository:gpu/m:pull"'})
    return handle


def test_a_token_realm_on_another_host_is_refused_and_sent_nothing(
    realm: _Stub, policy: Policy
) -> None:
    other = f"http://127.0.0.1:{realm.server_address[1]}/token"
    with _serve(_bearer_registry(other, [])) as stub:
        settings = RegistrySettings(f"127.0.0.1:{stub.server_address[1]}/gpu/m",
                                    plain_http=True, username=USER, password=PASSWORD)
        with pytest.raises(RegistryRealmRefused) as info:
            registry.find(settings, KEY, policy)
        assert info.value.exit_code == 86 and other in info.value.message
        # Listing an http realm is not possible: only https services can be allowed.
        listed = replace(settings, token_realms=(other.rsplit("/", 1)[0],))
        with pytest.raises(RegistryRealmRefused):
            registry.find(listed, KEY, policy)
    assert realm.seen == []  # not one request, so no credentials, reached the other host


def test_the_registrys_own_token_service_gets_the_credentials_and_works(
    policy: Policy
) -> None:
    token_seen: list[str] = []
    port: list[int] = []
    handle = _bearer_registry("/token", token_seen)  # a relative realm: the registry itself
    with _serve(handle) as stub:
        port.append(stub.server_address[1])
        settings = RegistrySettings(f"127.0.0.1:{port[0]}/gpu/m", plain_http=True,
                                    username=USER, password=PASSWORD)
        assert registry.find(settings, KEY, policy) is None  # 404: no artifact, no error
        basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        assert token_seen == [basic]
        assert all(auth in ("", "Bearer good") for _, path, auth in stub.seen
                   if not path.startswith("/token"))


def test_blob_redirects_to_storage_carry_no_credentials(tmp_path: Path) -> None:
    payload = b"module bytes"
    digest = "sha256:" + hashlib.sha256(payload).hexdigest()
    with _serve(lambda h: answer(h, 200, payload)) as storage:
        target = f"http://127.0.0.1:{storage.server_address[1]}/bucket/blob"

        def handle(h: BaseHTTPRequestHandler, target: str = target) -> None:
            if h.headers.get("Authorization", "").startswith("Basic "):
                answer(h, 307, headers={"Location": target})
            else:
                answer(h, 401, headers={"WWW-Authenticate": 'Basic realm="r"'})

        with _serve(handle) as stub:
            settings = RegistrySettings(f"127.0.0.1:{stub.server_address[1]}/gpu/m",
                                        plain_http=True, username=USER, password=PASSWORD)
            found = artifact.Artifact(f"{settings.repository}@{digest}", digest, {},
                                      (ModuleFile("nvidia.ko", digest[7:], len(payload)),),
                                      "", artifact.Evidence("", b"", b"", b"", ""))
            (tmp_path / "d").mkdir()
            registry.pull(settings, found, tmp_path / "d")
        assert (tmp_path / "d" / "nvidia.ko").read_bytes() == payload
        assert [auth for _, _, auth in storage.seen] == [""]


def test_layers_over_the_size_limit_are_refused_before_a_byte_of_them_is_read(
    policy: Policy
) -> None:
    # docker-registry refuses a manifest naming blobs it lacks, so a stand-in serves it.
    entries = [ModuleFile("nvidia.ko", "ab" * 32, artifact.LAYER_LIMIT + 1)]
    manifest = artifact.manifest_for(artifact.config_for(KEY, entries), entries, KEY)

    def handle(h: BaseHTTPRequestHandler) -> None:
        answer(h, 200, manifest if "/manifests/" in h.path else b"{}")

    with _serve(handle) as stub:
        settings = RegistrySettings(f"127.0.0.1:{stub.server_address[1]}/gpu/m",
                                    plain_http=True)
        with pytest.raises(ArtifactInvalid, match="size 536870913 is not within"):
            registry.find(settings, KEY, policy)
        assert [path for _, path, _ in stub.seen] == ["/v2/", f"/v2/gpu/m/manifests/{KEY.tag()}"]


def test_a_300_mb_manifest_is_refused_without_reading_it_whole(policy: Policy) -> None:
    sent = [0]

    def handle(h: BaseHTTPRequestHandler) -> None:
        if "/manifests/" not in h.path:
            answer(h, 200, b"{}")
            return
        h.send_response(200)
        h.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        h.send_header("Transfer-Encoding", "chunked")  # no Content-Length to refuse early
        h.end_headers()
        chunk = b" " * (1 << 20)
        try:
            for _ in range(300):
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent[0] += len(chunk)
            h.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client hung up: what we want

    with _serve(handle) as stub:
        settings = RegistrySettings(f"127.0.0.1:{stub.server_address[1]}/gpu/m",
                                    plain_http=True)
        started = time.monotonic()
        with pytest.raises(ArtifactInvalid, match="more than the 262144 bytes allowed"):
            registry.find(settings, KEY, policy)
        assert time.monotonic() - started < 10
        time.sleep(0.5)  # let the server notice the closed connection
    # The client read ~256 KiB and closed; socket buffers hold a few MB at most.
    assert sent[0] < 64 << 20
