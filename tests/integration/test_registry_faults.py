"""A registry that breaks mid-answer costs a compile, never the install: a manifest cut short,
a body that claims gzip and is not, a stall past the read timeout, a reset in the middle of a
module. `installer plan` and `installer run` end as with a registry that is down: a warning
that names the reason, no traceback, the node compiles. A registry that trickles a byte every
1.5 s ends within the pull's deadline; bodies the installer does not need (the /v2/ answer, an
error page, a redirect) are never read, whatever their size. Real HTTP servers on 127.0.0.1
(tests/httpfaults.py for the faults, small stand-ins for trickles and endless bodies)."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import kit
import pytest
from lib.hostkit import (
    INSTALL_DIR_HOST,
    debian_headers,
    installer_env,
    make_debian_host,
    run_installer,
)
from lib.httpfaults import FaultServer, QuietHandler, answer, serve_directory
from lib.registrykit import make_key_pair

from installer.delivery import artifact, oci, registry, trust
from installer.delivery.artifact import ArtifactKey, ModuleFile, Policy
from installer.delivery.oci import RegistrySettings
from installer.errors import RegistryUnavailable

A = "580.105.08"
NAME = "gpu/m"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The settings of a mirror serving the kit's .run, and the digests file vouching for it."""
    www = tmp_path_factory.mktemp("www")
    kit.build_runfile(A, www / A)
    digests = kit.write_digests(www.parent / f"{www.name}.digests", www)
    with serve_directory(www) as (base, _requests):
        yield {"NVIDIA_DRIVER_MIRRORS": base, "NVIDIA_DRIVER_DIGESTS_FILE": str(digests)}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_key_pair(tmp_path_factory.mktemp("keys"), "builder")


@dataclass
class Published:
    """A signed artifact served by a FaultServer as a registry would: its paths by role."""

    manifest: str
    blob: str  # nvidia.ko's
    digest: str


def publish(srv: FaultServer, key: ArtifactKey, private: Path,
            faults: dict[str, dict[str, Any]]) -> Published:
    """Serve `/v2/` and a correctly signed artifact of `key` under 127.0.0.1:<port>/gpu/m;
    `faults` maps a role (manifest, blob) to the FaultServer faults of its route."""
    repository = f"127.0.0.1:{srv.port}/{NAME}"
    modules = {"nvidia.ko": b"\x7fELF module bytes " * 4000, "nvidia-uvm.ko": b"uvm" * 100}
    entries = [ModuleFile(n, hashlib.sha256(b).hexdigest(), len(b)) for n, b in modules.items()]
    config = artifact.config_for(key, entries)
    manifest = artifact.manifest_for(config, entries, key)
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    payload = trust.payload(repository, digest)
    signature = trust.load_signer(private).sign(payload)
    sig_config = trust.signature_config("sha256:" + hashlib.sha256(payload).hexdigest())
    sig_manifest = artifact.signature_manifest(None, payload, signature, sig_config)
    base = f"/v2/{NAME}"
    paths = Published(f"{base}/manifests/{key.tag()}",
                      f"{base}/blobs/sha256:{entries[0].sha256}", digest)
    srv.add("/v2/", b"{}")
    srv.add(paths.manifest, manifest, **faults.get("manifest", {}))
    srv.add(f"{base}/manifests/{trust.signature_tag(digest)}", sig_manifest)
    for blob in (config, payload, sig_config, modules["nvidia-uvm.ko"]):
        srv.add(f"{base}/blobs/sha256:{hashlib.sha256(blob).hexdigest()}", blob)
    srv.add(paths.blob, modules["nvidia.ko"], **faults.get("blob", {}))
    return paths


def registry_env(root: Path, kernel: str, served: dict[str, str], srv: FaultServer,
                 keys: tuple[Path, Path], **settings: str) -> dict[str, str]:
    """A node installing A from the `served` mirror, its modules from the artifact `srv` serves
    (trusting the builder's key)."""
    return installer_env(
        root, kernel, NVIDIA_DRIVER_VERSION=A, **served,
        NVIDIA_MODULE_REGISTRY=f"127.0.0.1:{srv.port}/{NAME}",
        NVIDIA_MODULE_REGISTRY_PLAIN_HTTP="true", NVIDIA_MODULE_TRUSTED_KEYS=str(keys[1]),
        **settings)


def drivers(root: Path) -> list[str]:
    return sorted(p.name for p in (root / INSTALL_DIR_HOST.lstrip("/") / "drivers").glob("*.ko"))


ALWAYS = 1000  # fault counters that outlast every request of a test

FAULTS = {
    "manifest-cut-short": ({"manifest": {"truncate_after": 40, "truncate_times": ALWAYS}},
                           "incompleteread"),
    "manifest-bad-gzip": ({"manifest": {"headers": {"Content-Encoding": "gzip"}}},
                          "content-encoding gzip"),
    "manifest-stall": ({"manifest": {"stall": 4.0, "stall_after": 20}}, "timed out"),
    "manifest-reset": ({"manifest": {"reset_after": 30, "reset_times": ALWAYS}}, "reset"),
    "module-reset": ({"blob": {"reset_after": 1000, "reset_times": ALWAYS}}, "reset"),
    "module-cut-short": ({"blob": {"truncate_after": 5000, "truncate_times": ALWAYS}},
                         "incompleteread"),
}


@pytest.mark.skipif(debian_headers() is None, reason="needs linux-headers-amd64")
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_registry_that_breaks_mid_body_costs_a_compile_not_a_traceback(
        tmp_path: Path, served: dict[str, str], keys: tuple[Path, Path], fault: str) -> None:
    faults, reason = FAULTS[fault]
    root = tmp_path / "node"
    kernel = make_debian_host(root)
    with FaultServer() as srv:
        paths = publish(srv, ArtifactKey(A, kernel, "open", "x86_64"), keys[0], faults)
        env = registry_env(root, kernel, served, srv, keys, NVIDIA_INSTALLER_READ_TIMEOUT="1")
        plan = run_installer(env, "plan")
        run = run_installer(env, "run")

    for result in (plan, run):
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    if "manifest" in faults:
        assert "prebuilt-modules: unavailable" in plan.stdout, plan.stdout
        said = plan.stdout + run.stderr
        assert "prebuilt-modules = unavailable" in run.stderr
    else:  # the lookup works; the pull breaks
        assert f"prebuilt-modules: 127.0.0.1:{srv.port}/{NAME}@{paths.digest}" in plan.stdout
        said = run.stderr
        assert "prebuilt modules not used (error[registry-unavailable]: " in said
        assert "compiling instead" in said
    assert "error[registry-unavailable]: " in said
    assert reason in said.lower(), said[-3000:]
    assert (paths.blob if "blob" in faults else paths.manifest) in said  # the URL, named
    assert "step build-modules: done" in run.stderr
    assert drivers(root) == ["nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]


@pytest.mark.skipif(debian_headers() is None, reason="needs linux-headers-amd64")
def test_preparing_the_next_kernel_outlives_a_registry_that_breaks(
        tmp_path: Path, served: dict[str, str], keys: tuple[Path, Path]) -> None:
    """What the DaemonSet's `prepare-next-kernel --watch` container does each round: the
    artifact of the pending kernel breaks mid-body, so it falls back to compiling (here: no
    headers for that kernel) and reports a clear error instead of dying with a traceback."""
    from lib.secondkernel import mark_installed

    root = tmp_path / "node"
    kernel = make_debian_host(root)
    pending = re.sub(r"-\d+-", "-999-", kernel, count=1)  # 6.1.0-56-amd64 -> 6.1.0-999-amd64
    mark_installed(root, pending)
    with FaultServer() as srv:
        paths = publish(srv, ArtifactKey(A, pending, "open", "x86_64"), keys[0],
                        {"manifest": {"reset_after": 30, "reset_times": ALWAYS}})
        env = registry_env(root, kernel, served, srv, keys, NVIDIA_INSTALLER_NEXT_KERNEL="separate")
        installed = run_installer(env, "run")
        assert installed.returncode == 0, installed.stderr[-3000:]
        prepared = run_installer(env, "prepare-next-kernel")

    assert "Traceback" not in prepared.stderr, prepared.stderr[-3000:]
    assert "prebuilt modules not used (error[registry-unavailable]: " in prepared.stderr
    assert paths.manifest in prepared.stderr and "reset" in prepared.stderr
    assert f"next kernel {pending}: modules not prepared (error[kernel-headers-missing]" in (
        prepared.stderr)
    assert prepared.returncode == 30, prepared.stderr[-3000:]


# --------------------------------------------------------------------------- stand-ins


class _Stub(ThreadingHTTPServer):
    daemon_threads = True
    handle_fn: Callable[[BaseHTTPRequestHandler], None]
    stopping: threading.Event
    sent: list[int]
    connections = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections += 1
        super().process_request(request, client_address)


class _Handler(QuietHandler):
    server: _Stub

    def do_GET(self) -> None:
        try:
            self.server.handle_fn(self)
        except OSError:
            self.close_connection = True  # the client hung up: what these tests provoke


@contextmanager
def stub(handle: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[_Stub]:
    server = _Stub(("127.0.0.1", 0), _Handler)
    server.handle_fn = handle
    server.stopping = threading.Event()
    server.sent = [0]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()


def trickle(h: BaseHTTPRequestHandler, server: _Stub, data: bytes) -> None:
    """One byte every 1.5 s: never a read timeout, never an end."""
    for byte in data:
        if server.stopping.wait(1.5):
            return
        h.wfile.write(bytes([byte]))
        h.wfile.flush()


def endless(h: BaseHTTPRequestHandler, server: _Stub, status: int,
            headers: dict[str, str] | None = None) -> None:
    """A chunked body of spaces that never ends, counted in server.sent."""
    h.send_response(status)
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    chunk = b" " * (1 << 20)
    while not server.stopping.is_set() and server.sent[0] < 512 << 20:
        h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        server.sent[0] += len(chunk)


def settings_for(server: _Stub, **extra: Any) -> RegistrySettings:
    return RegistrySettings(f"127.0.0.1:{server.server_address[1]}/{NAME}", plain_http=True,
                            **extra)


KEY = ArtifactKey("580.95.05", "6.1.0-26-amd64", "open", "x86_64")


@pytest.fixture
def policy(keys: tuple[Path, Path]) -> Policy:
    return Policy(trust.load_trust_root(keys[1]))


def ended(call: Callable[[], object], limit: float = 30.0) -> BaseException | None:
    """What `call` raised (None when it returned); fails when it is still busy after `limit`."""
    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(limit)
    assert not worker.is_alive(), f"still busy after {limit} s"
    return outcome[0]


@pytest.mark.parametrize("where", ["manifest-body", "manifest-headers"])
def test_a_registry_trickling_a_byte_every_1_5_s_ends_at_the_deadline(
        policy: Policy, where: str) -> None:
    def handle(h: BaseHTTPRequestHandler) -> None:
        if h.path == "/v2/":
            answer(h, 200, b"{}")
        elif where == "manifest-body":
            h.send_response(200)
            h.send_header("Content-Length", "4000")
            h.end_headers()
            trickle(h, server, b"{" + b" " * 3999)
        else:
            h.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            trickle(h, server, b"a" * 60000)

    with stub(handle) as server:
        settings = settings_for(server, deadline=2.0, read_timeout=5.0)
        error = ended(lambda: registry.find(settings, KEY, policy))
    assert isinstance(error, RegistryUnavailable), error
    assert type(error) is RegistryUnavailable and error.exit_code == 75
    assert "not done within the 2 s allowed" in error.message
    assert f"/v2/{NAME}/manifests/{KEY.tag()}" in error.message


def test_a_tls_handshake_trickling_in_ends_at_the_deadline(policy: Policy) -> None:
    """A server that answers the ClientHello with a TLS record header announcing 16 KiB and
    then a byte every 1.5 s: the handshake never fails and never ends, until the deadline
    (the connect timeout, which bounds urllib3's handshake, is set longer so that only the
    deadline can end it here)."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    stopping = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)  # the ClientHello
            conn.sendall(b"\x16\x03\x03\x40\x00")  # a handshake record of 16384 bytes
            while not stopping.wait(1.5):
                try:
                    conn.sendall(b"\x00")
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    port = listener.getsockname()[1]
    settings = RegistrySettings(f"127.0.0.1:{port}/{NAME}", deadline=2.0,
                                connect_timeout=60.0, read_timeout=60.0)
    try:
        error = ended(lambda: registry.find(settings, KEY, policy))
    finally:
        stopping.set()
        listener.close()
    assert type(error) is RegistryUnavailable, error
    assert "not done within the 2 s allowed" in error.message
    assert f"GET https://127.0.0.1:{port}/v2/" in error.message


def test_a_module_trickling_in_ends_at_the_pulls_deadline(tmp_path: Path) -> None:
    data = b"module" * 100
    item = ModuleFile("nvidia.ko", hashlib.sha256(data).hexdigest(), len(data))

    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        trickle(h, server, data)

    with stub(handle) as server:
        settings = settings_for(server, deadline=2.0, read_timeout=5.0)
        found = artifact.Artifact(f"{settings.repository}@sha256:{'0' * 64}", "", {},
                                  (item,), "", artifact.Evidence("", b"", b"", b"", ""))
        error = ended(lambda: registry.pull(settings, found, tmp_path))
    assert type(error) is RegistryUnavailable, error
    assert "not done within the 2 s allowed" in error.message
    assert f"blobs/sha256:{item.sha256}" in error.message


def test_bodies_the_installer_does_not_need_are_never_read(policy: Policy) -> None:
    """An endless /v2/ answer, an endless redirect and an endless error page: the lookup
    answers from the status lines and closes each connection."""
    def handle(h: BaseHTTPRequestHandler) -> None:
        if h.path == "/v2/":
            endless(h, server, 200)
        elif "/manifests/" in h.path:
            endless(h, server, 307, {"Location": f"/v2/{NAME}/moved"})
        else:
            endless(h, server, 500)

    with stub(handle) as server:
        error = ended(lambda: registry.find(settings_for(server), KEY, policy))
        sent = server.sent[0]
    assert type(error) is RegistryUnavailable, error
    assert f"{NAME}:{KEY.tag()}: HTTP 500" in error.message
    assert sent < 64 << 20  # what socket buffers hold, not the 512 MiB each would send


def test_an_endless_token_answer_is_cut_at_its_limit(policy: Policy) -> None:
    def handle(h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/token"):
            endless(h, server, 200)
        else:
            answer(h, 401, headers={"WWW-Authenticate": 'Bearer realm="/token",service="r"'})

    with stub(handle) as server:
        settings = settings_for(server, username="u", password="p")
        error = ended(lambda: registry.find(settings, KEY, policy))
    assert error is not None and error.reference == "registry-auth-failed", error
    assert "sent no token" in str(error)


def test_small_replies_nobody_needs_are_read_so_one_connection_serves_a_lookup(
        policy: Policy) -> None:
    """Streaming every reply must not cost a connection (a TLS handshake) per request."""
    def handle(h: BaseHTTPRequestHandler) -> None:
        answer(h, 200 if h.path == "/v2/" else 404, b"{}")

    with stub(handle) as server:
        assert registry.find(settings_for(server), KEY, policy) is None
    assert server.connections == 1


def test_the_deadline_scales_with_what_a_pull_carries() -> None:
    from installer.delivery import oci

    settings = RegistrySettings("r.example/x")
    assert settings.deadline == oci.PULL_DEADLINE
    assert oci.budget(settings, 0) == oci.PULL_DEADLINE
    big = oci.budget(settings, 135 * 10**6)  # NVIDIA's modules
    assert big == oci.PULL_DEADLINE + 135 * 10**6 / oci.SLOWEST_RATE
    assert oci.budget(replace(settings, deadline=2.0), 0) == 2.0


@pytest.mark.parametrize("answer_with", [
    (302, {"Location": "http://[::1/x"}),
    (401, {"WWW-Authenticate": 'Bearer realm="https://[bad/token",service="r"'}),
])
def test_a_malformed_redirect_or_realm_is_the_registrys_failure_not_a_traceback(
        policy: Policy, answer_with: tuple[int, dict[str, str]]) -> None:
    """URLs a registry hands back (a redirect's Location, a token realm) that urllib cannot
    even parse end in a registry error, so the node compiles instead."""
    status, headers = answer_with

    def handle(h: BaseHTTPRequestHandler) -> None:
        if h.path == "/v2/":
            answer(h, 200)
        else:
            answer(h, status, headers=headers)

    with stub(handle) as server:
        error = ended(lambda: registry.find(settings_for(server, username="u", password="p"),
                                            KEY, policy))
    assert isinstance(error, RegistryUnavailable), repr(error)
    assert "[::1/x" in error.message or "[bad/token" in error.message


def test_credentials_do_not_follow_a_redirect_to_plain_http_on_the_same_host() -> None:
    """A TLS registry redirecting to http:// on its own host would show the password on the
    wire: only the registry's own scheme and host get the Authorization header."""
    client = oci.Client(RegistrySettings("127.0.0.1:5000/gpu/m", username="u", password="p"))
    try:
        client._scheme = "basic"
        assert client._authorization("https://127.0.0.1:5000/v2/gpu/m/manifests/t") is not None
        assert client._authorization("http://127.0.0.1:5000/v2/gpu/m/blobs/x") is None
    finally:
        client.close()
