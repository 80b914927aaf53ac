"""A real Kubernetes control plane for the cluster tests: etcd, kube-apiserver (TLS, a
service-account issuer, Node,RBAC authorization, NodeRestriction and ValidatingAdmissionPolicy
admission, resource.k8s.io served), kube-controller-manager with the controllers the tests lean on
and kube-scheduler, all from what `scripts/control-plane` built and cached outside the clone.

One control plane per test session (per xdist worker at worst): `start_in_background` boots it
while the session's other tests run (tests/conftest.py calls it once collection shows a test
wants it), and `control_plane()` waits for it. Tests share it: each works in its own namespace
and on Nodes named after it. Without the binaries, `control_plane()` skips with the command that
builds them."""

from __future__ import annotations

import atexit
import base64
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "control-plane"
NAMESPACE_OF_INSTALLER = "kube-system"  # where the shipped RBAC binds the installer's account
INSTALLER_ACCOUNT = "nvidia-driver-installer"
TOOLS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# The controllers the tests lean on (kube-controller-manager's --controllers names): without the
# disruption controller every eviction under a PDB is 429; the status controller is the one that
# writes a policy's status.typeChecking. No node-lifecycle: nodes here have no kubelet.
CONTROLLERS = ("disruption-controller", "daemonset-controller", "garbage-collector-controller",
               "serviceaccount-controller", "serviceaccount-token-controller",
               "root-ca-certificate-publisher-controller",
               "validatingadmissionpolicy-status-controller", "resourceclaim-controller")
# Kills the components (and removes their directory) once the test process is gone, however it
# went (a CI timeout's SIGKILL runs no cleanup): they run in sessions of their own.
_WATCHDOG = """
import os, shutil, signal, sys, time
parent, directory, pids = int(sys.argv[1]), sys.argv[2], [int(p) for p in sys.argv[3:]]
while True:
    time.sleep(1)
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
for pid in pids:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
shutil.rmtree(directory, ignore_errors=True)
"""
# resource.k8s.io's beta versions served besides v1 (off by default since 1.34): what a 1.32 or
# 1.33 cluster serves, for the installer's choice of version (tests/cluster/test_dra.py).
RUNTIME_CONFIG = ("--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",)
START_TIMEOUT = 180.0  # a loaded 2-core machine; an idle one is ready in seconds
# The control plane starts in a background thread while other tests run, among them unit tests
# whose guard replaces subprocess.Popen to refuse their own processes: this module keeps the real
# one, taken when it is imported (at collection, before any test).
_POPEN = subprocess.Popen


def paths() -> tuple[Path, Path]:
    """The binaries' directory and etcd, as scripts/control-plane keys them (built or not)."""
    with _POPEN([str(SCRIPT), "--paths"], stdout=subprocess.PIPE, text=True) as proc:
        out, _ = proc.communicate(timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/control-plane --paths exited {proc.returncode}")
    first, second = out.split()[:2]
    return Path(first), Path(second)


def missing() -> str | None:
    """Why the control plane cannot run here, or None."""
    bin_dir, etcd = paths()
    absent = [str(bin_dir / t) for t in TOOLS if not (bin_dir / t).is_file()]
    if not etcd.is_file():
        absent.append(str(etcd))
    if absent:
        return (f"no Kubernetes control plane built ({', '.join(absent)} missing): "
                "run scripts/control-plane as root")
    return None


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('message', body)}")
        self.status, self.body = status, body


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pki(d: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import NameOID

    from lib.tlskit import issue_certificate, new_key, write_key

    def pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    ca_key = new_key()
    ca = issue_certificate("control-plane test CA", ca_key, None)
    (d / "ca.crt").write_bytes(pem(ca))
    write_key(d / "ca.key", ca_key)
    key = new_key()
    server = issue_certificate("kube-apiserver", key, (ca, ca_key),
                               [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                x509.DNSName("localhost")])
    (d / "server.crt").write_bytes(pem(server))
    write_key(d / "server.key", key)
    # The administrator: a client certificate in system:masters (issue_certificate gives only
    # a CN; the organization is the group).
    import datetime

    from cryptography.hazmat.primitives import hashes

    admin_key = new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    admin = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME,
                                                         "system:masters"),
                                      x509.NameAttribute(NameOID.COMMON_NAME, "admin")]))
             .issuer_name(ca.subject).public_key(admin_key.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .sign(ca_key, hashes.SHA256()))
    (d / "admin.crt").write_bytes(pem(admin))
    write_key(d / "admin.key", admin_key)
    sa_key = new_key()  # the service-account issuer's signing key (ES256)
    write_key(d / "sa.key", sa_key)
    (d / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def kubeconfig(path: Path, server: str, ca: Path, *, token: str | None = None,
               cert: Path | None = None, key: Path | None = None) -> Path:
    user: dict[str, str] = {}
    if token is not None:
        user["token"] = token
    if cert is not None and key is not None:
        user["client-certificate"], user["client-key"] = str(cert), str(key)
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server,
                                                  "certificate-authority": str(ca)}}],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}))
    return path


@dataclass
class ControlPlane:
    """The running control plane: `request` as the administrator or with a token."""

    dir: Path
    url: str
    bin_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    watchdog: subprocess.Popen[bytes] | None = None

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"

    def _context(self, admin: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if admin:
            ctx.load_cert_chain(self.dir / "admin.crt", self.dir / "admin.key")
        return ctx

    def request(self, method: str, path: str, body: Any = None, *, token: str | None = None,
                content_type: str = "application/json",
                query: dict[str, str] | None = None) -> dict[str, Any]:
        """The decoded answer; ApiError for any status >= 400."""
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, context=self._context(token is None),
                                        timeout=30) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = {"message": raw.decode(errors="replace")}
            raise ApiError(e.code, payload) from None
        return json.loads(raw) if raw else {}

    def create(self, path: str, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.request("POST", path, obj, **kw)

    def get(self, path: str, **kw: Any) -> dict[str, Any]:
        return self.request("GET", path, **kw)

    def apply(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """`kubectl <args>` as the administrator."""
        return subprocess.run([str(self.kubectl), "--kubeconfig", str(self.admin_kubeconfig),
                               *args], input=stdin, capture_output=True, text=True,
                              timeout=120)

    # --- objects the tests need ---------------------------------------------------------------

    def namespace(self, name: str) -> str:
        with contextlib.suppress(ApiError):
            self.create("/api/v1/namespaces", {"metadata": {"name": name}})
        return name

    def node(self, name: str, labels: dict[str, str] | None = None,
             taints: list[dict[str, str]] | None = None, ready: bool = True) -> dict[str, Any]:
        """A Node as a kubelet registers one (the administrator writes it: no kubelet here),
        Ready when `ready`."""
        node = self.create("/api/v1/nodes", {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "kubernetes.io/os": "linux",
                                                  "kubernetes.io/arch": "amd64",
                                                  **(labels or {})}},
            "spec": {"taints": taints or []}})
        if ready:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            node = self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "test node", "lastHeartbeatTime": now,
                                "lastTransitionTime": now}],
                "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}},
                content_type="application/strategic-merge-patch+json")
        return node

    def service_account(self, namespace: str, name: str) -> None:
        with contextlib.suppress(ApiError):
            self.create(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                        {"metadata": {"name": name}})

    def pod_token(self, node: str, *, account: str = INSTALLER_ACCOUNT,
                  namespace: str = NAMESPACE_OF_INSTALLER, pod: str | None = None) -> str:
        """A token from the TokenRequest API bound to a Pod of `account` on `node`: what the
        installer's pod gets projected (the server adds the node's name and uid to it)."""
        self.service_account(namespace, account)
        pod = pod or f"{account}-{node}"[:63].rstrip("-.")
        try:
            obj = self.create(f"/api/v1/namespaces/{namespace}/pods", {
                "metadata": {"name": pod},
                "spec": {"nodeName": node, "serviceAccountName": account,
                         "automountServiceAccountToken": False,
                         "containers": [{"name": "installer", "image": "installer:test"}]}})
        except ApiError as e:
            if e.status != 409:
                raise
            obj = self.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
        answer = self.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"audiences": [], "expirationSeconds": 3600,
                      "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod,
                                         "uid": obj["metadata"]["uid"]}}})
        return str(answer["status"]["token"])

    def stop(self) -> None:
        """Scheduler, controller manager, API server, then etcd, each given a few seconds to
        exit (the API server shuts down cleanly only while etcd still answers)."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def token_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def _spawn(cp: ControlPlane, name: str, argv: list[str]) -> None:
    log = open(cp.dir / f"{name}.log", "wb")  # noqa: SIM115 - the process keeps it
    # Low priority: the machine is shared, and a test waits on the server only when it asks.
    cp.procs[name] = _POPEN(["nice", "-n", "5", *argv], stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)


def _wait(cp: ControlPlane, what: str, ok: Any, deadline: float) -> None:
    while time.monotonic() < deadline:
        for name, proc in cp.procs.items():
            if proc.poll() is not None:
                tail = (cp.dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited {proc.returncode}:\n{tail}")
        with contextlib.suppress(Exception):
            if ok():
                return
        time.sleep(0.2)
    raise RuntimeError(f"control plane: {what} not ready in {START_TIMEOUT:.0f} s")


def start(extra_controllers: tuple[str, ...] = ()) -> ControlPlane:
    """Boots the control plane and waits until the API server is ready and the controllers
    have made the namespaces' ServiceAccounts. `extra_controllers`: kube-controller-manager's
    names of controllers to run beside CONTROLLERS (bench/bench_fleet_rollout.py runs the
    replicaset controller, so that pods evicted under a PDB are replaced)."""
    bin_dir, etcd = paths()
    d = Path(tempfile.mkdtemp(prefix="control-plane-"))
    _pki(d)
    eclient, epeer, port = _free_port(), _free_port(), _free_port()
    cp = ControlPlane(d, f"https://127.0.0.1:{port}", bin_dir)
    deadline = time.monotonic() + START_TIMEOUT
    try:
        ec, ep = f"http://127.0.0.1:{eclient}", f"http://127.0.0.1:{epeer}"
        _spawn(cp, "etcd", [str(etcd), "--name", "t", "--data-dir", str(d / "etcd"),
                            "--listen-client-urls", ec, "--advertise-client-urls", ec,
                            "--listen-peer-urls", ep, "--initial-advertise-peer-urls", ep,
                            "--initial-cluster", f"t={ep}", "--unsafe-no-fsync",
                            "--log-level", "warn"])
        _spawn(cp, "kube-apiserver", [
            str(bin_dir / "kube-apiserver"), f"--etcd-servers={ec}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={port}", f"--cert-dir={d / 'certs'}",
            f"--tls-cert-file={d / 'server.crt'}", f"--tls-private-key-file={d / 'server.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--service-cluster-ip-range=10.0.0.0/24", "--endpoint-reconciler-type=none",
            "--allow-privileged=true", "--profiling=false", *RUNTIME_CONFIG])
        kubeconfig(cp.admin_kubeconfig, cp.url, cp.ca, cert=d / "admin.crt",
                   key=d / "admin.key")

        def ready() -> bool:
            with urllib.request.urlopen(cp.url + "/readyz", context=cp._context(True),
                                        timeout=5) as r:
                return bool(r.status == 200)

        _wait(cp, "kube-apiserver", ready, deadline)
        _spawn(cp, "kube-controller-manager", [
            str(bin_dir / "kube-controller-manager"), f"--kubeconfig={cp.admin_kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
            f"--service-account-private-key-file={d / 'sa.key'}", f"--root-ca-file={d / 'ca.crt'}",
            "--use-service-account-credentials=false", "--profiling=false",
            "--controllers=" + ",".join(CONTROLLERS + tuple(extra_controllers))])
        _spawn(cp, "kube-scheduler", [
            str(bin_dir / "kube-scheduler"), f"--kubeconfig={cp.admin_kubeconfig}",
            f"--authentication-kubeconfig={cp.admin_kubeconfig}",
            f"--authorization-kubeconfig={cp.admin_kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
            "--profiling=false"])
        cp.watchdog = _POPEN(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(d),
             *(str(p.pid) for p in cp.procs.values())], start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(cp, "the kube-system ServiceAccounts",
              lambda: cp.get("/api/v1/namespaces/kube-system/serviceaccounts/default"),
              deadline)
    except BaseException:
        cp.stop()
        raise
    return cp


_lock = threading.Lock()
_thread: threading.Thread | None = None
_result: list[ControlPlane | BaseException] = []


def start_in_background() -> None:
    """Begins booting the session's control plane (once); control_plane() collects it."""
    global _thread
    with _lock:
        if _thread is not None or missing() is not None:
            return

        def run() -> None:
            try:
                _result.append(start())
            except BaseException as e:
                _result.append(e)

        _thread = threading.Thread(target=run, name="control-plane", daemon=True)
        _thread.start()


def control_plane() -> ControlPlane:
    """The session's running control plane (skips the test without the binaries)."""
    import pytest

    reason = missing()
    if reason is not None:
        if os.environ.get("CI"):  # CI's scripts/install-deps builds it: missing is a failure
            pytest.fail(reason)
        pytest.skip(reason)
    start_in_background()
    assert _thread is not None
    _thread.join()
    result = _result[0]
    if isinstance(result, BaseException):
        raise result
    return result


@atexit.register
def stop_all() -> None:
    """Stops the session's control plane (tests/conftest.py at session end: an xdist worker
    leaves without running atexit handlers)."""
    if _thread is not None:
        _thread.join(START_TIMEOUT)
    while _result:
        result = _result.pop()
        if isinstance(result, ControlPlane):
            result.stop()
