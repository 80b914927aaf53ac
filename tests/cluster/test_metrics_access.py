"""`installer metrics --access tokenreview` against a real kube-apiserver
(tests/lib/controlplane.py, through tests/lib/apiproxy.py, which records the reviews asked) with
components/metrics-auth's RBAC applied as shipped: the exporter runs as the installer's
ServiceAccount with a token bound to its pod; a scraper's token from the TokenRequest API of the
shipped reader ServiceAccount (and the token Secret the PodMonitor sends, filled in by the token
controller) reads the metrics, a ServiceAccount without the grant is forbidden, a token the
server never issued is unauthenticated; the installer's account without the shipped review role
cannot ask (503), and a binding taken away stops working once the kept answer expires; a
server that is gone is a 503, a review the server finds invalid is its 422, and the command
without any credentials refuses to start."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from lib.apiproxy import ApiProxy
from lib.controlplane import ApiError, ControlPlane
from lib.hosttrees import make_host, root_env

from installer.cluster.access import ScrapeAccess
from installer.cluster.client import NodeClient

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "daemonset" / "components" / "metrics-auth" / "rbac.yaml"
READER = "nvidia-driver-installer-metrics-reader"
READER_SECRET = "nvidia-driver-installer-metrics-reader-token"
REVIEW_ROLE = "nvidia-driver-installer-metrics-auth"
CLUSTERROLEBINDINGS = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
_tests = iter(range(1_000_000))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("WWW-Authenticate", "")


def token_of(cp: ControlPlane, namespace: str, account: str) -> str:
    """A token of the account from the TokenRequest API (bound to no object: a scraper's)."""
    return str(cp.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                         {"spec": {"audiences": [], "expirationSeconds": 3600}})
               ["status"]["token"])


def may_get_metrics(cp: ControlPlane, namespace: str, account: str) -> bool:
    review = cp.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {"spec": {
        "user": f"system:serviceaccount:{namespace}:{account}",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                   "system:authenticated"],
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}})
    return bool(review["status"].get("allowed"))


def until(what: str, ok: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


@dataclass
class Metrics:
    cp: ControlPlane
    proxy: ApiProxy
    node: str
    ns: str  # the test's own namespace, for accounts without the grant
    kubeconfig: Path  # the installer's pod-bound token, through the proxy
    bindings: list[str] = field(default_factory=list)  # removed when the test ends

    def reviews(self) -> list[tuple[str, int]]:
        return [(s.path.split("?")[0].rsplit("/", 1)[1], s.status) for s in self.proxy.seen
                if s.path.split("?")[0].endswith("reviews")]

    def bind(self, name: str, role: str, account: str) -> None:
        self.cp.create(CLUSTERROLEBINDINGS, {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": self.ns}]})
        self.bindings.append(name)


@pytest.fixture
def metrics(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Metrics]:
    cp = control_plane
    done = cp.apply("apply", "--server-side", "--force-conflicts", "-f", str(RBAC))
    assert done.returncode == 0, done.stderr
    until("the shipped reader may get /metrics",
          lambda: may_get_metrics(cp, "kube-system", READER))
    n = next(_tests)
    node, ns = f"metrics-{n}-node", cp.namespace(f"metrics-{n}")
    pod = f"metrics-{n}-installer"
    cp.node(node)
    env: Metrics | None = None
    try:
        # The DaemonSet's pod on the node, as the installer's account (the shipped binding's).
        token = cp.pod_token(node, pod=pod)
        with ApiProxy(cp, tmp_path / "proxy-tls") as proxy:
            env = Metrics(cp, proxy, node, ns, proxy.kubeconfig(tmp_path / "kubeconfig", token))
            yield env
    finally:
        for name in env.bindings if env is not None else []:
            with contextlib.suppress(ApiError):
                cp.request("DELETE", f"{CLUSTERROLEBINDINGS}/{name}")
        with contextlib.suppress(ApiError):
            cp.request("DELETE", f"/api/v1/namespaces/kube-system/pods/{pod}",
                       {"gracePeriodSeconds": 0})
        with contextlib.suppress(ApiError):
            cp.request("DELETE", f"/api/v1/nodes/{node}")


@pytest.fixture
def exporter(metrics: Metrics, tmp_path: Path) -> Iterator[int]:
    """`installer metrics --access tokenreview` as the container runs it, with the pod's
    kubeconfig; the port it listens on once it answers."""
    root = tmp_path / "host"
    make_host(root, distro="debian-12")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **root_env(root, NVIDIA_INSTALL_DIR_HOST="/var/lib/nvidia"),
           "NVIDIA_INSTALLER_KUBECONFIG": str(metrics.kubeconfig), "NODE_NAME": metrics.node}
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "installer", "metrics", "--listen", f"127.0.0.1:{port}",
         "--access", "tokenreview"], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape(port)
                break
            except OSError:
                assert process.poll() is None, process.communicate()[1]
                assert time.monotonic() < deadline, "the exporter never listened"
                time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=15)
        assert "Traceback" not in stderr, stderr


def test_the_shipped_readers_token_reads_the_metrics_and_is_asked_once(
        metrics: Metrics, exporter: int) -> None:
    status, body = scrape(exporter, token_of(metrics.cp, "kube-system", READER))
    assert status == 200, body
    assert "nvidia_driver_installer_record_valid" in body
    assert metrics.reviews() == [("tokenreviews", 201), ("subjectaccessreviews", 201)]
    for _ in range(3):
        assert scrape(exporter, token_of(metrics.cp, "kube-system", READER))[0] == 200
    # Each new token is reviewed; the same token again is answered from what was kept.
    asked = len(metrics.reviews())
    assert asked == 8
    token = token_of(metrics.cp, "kube-system", READER)
    assert scrape(exporter, token)[0] == 200
    assert scrape(exporter, token)[0] == 200
    assert len(metrics.reviews()) == asked + 2


def test_the_podmonitors_secret_token_reads_the_metrics(metrics: Metrics,
                                                        exporter: int) -> None:
    """The token controller fills in the shipped Secret the PodMonitor sends."""
    path = f"/api/v1/namespaces/kube-system/secrets/{READER_SECRET}"
    until("the token controller filled the reader's Secret",
          lambda: "token" in (metrics.cp.get(path).get("data") or {}))
    token = base64.b64decode(metrics.cp.get(path)["data"]["token"]).decode()
    status, body = scrape(exporter, token)
    assert status == 200, body


def test_an_account_without_the_grant_is_forbidden(metrics: Metrics, exporter: int) -> None:
    metrics.cp.service_account(metrics.ns, "gpu-job")
    assert not may_get_metrics(metrics.cp, metrics.ns, "gpu-job")
    assert scrape(exporter, token_of(metrics.cp, metrics.ns, "gpu-job"))[0] == 403
    # Authenticated (the TokenReview said who), then refused by the SubjectAccessReview.
    assert metrics.reviews() == [("tokenreviews", 201), ("subjectaccessreviews", 201)]


@pytest.mark.parametrize("token", [
    "garbage",
    # Shaped like a service-account JWT, signed by no key the server trusts.
    "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6a3ViZS1zeXN0ZW06eCJ9.c2ln",
])
def test_a_token_the_server_never_issued_is_unauthenticated(metrics: Metrics, exporter: int,
                                                            token: str) -> None:
    assert scrape(exporter, token) == (401, 'Bearer realm="nvidia-driver-installer"')
    # Asked once; no SubjectAccessReview for a user nobody vouched for.
    assert metrics.reviews() == [("tokenreviews", 201)]


def test_no_token_is_unauthenticated_without_asking(metrics: Metrics, exporter: int) -> None:
    assert scrape(exporter) == (401, 'Bearer realm="nvidia-driver-installer"')
    assert metrics.reviews() == []


def test_without_the_shipped_review_role_the_installer_cannot_ask(metrics: Metrics,
                                                                  tmp_path: Path) -> None:
    """The installer's account without components/metrics-auth's review role: the server
    refuses the TokenReview (403), every scrape is a 503 (not kept), until the role is bound."""
    cp = metrics.cp
    account = "unreviewed-nvidia-driver-installer"
    cp.service_account(metrics.ns, account)
    pod = cp.pod_token(metrics.node, account=account, namespace=metrics.ns)
    kubeconfig = metrics.proxy.kubeconfig(tmp_path / "unreviewed", pod)
    access = ScrapeAccess(NodeClient(metrics.node, str(kubeconfig)))
    reader = f"Bearer {token_of(cp, 'kube-system', READER)}"
    assert access.check(reader).status == 503
    assert metrics.reviews() == [("tokenreviews", 403)]
    metrics.bind(f"{metrics.ns}-review", REVIEW_ROLE, account)
    until("the review role reaches the authorizer",
          lambda: access.check(reader).status == 200)
    assert metrics.reviews()[-2:] == [("tokenreviews", 201), ("subjectaccessreviews", 201)]


def test_a_binding_taken_away_stops_working_once_the_answer_expires(metrics: Metrics) -> None:
    cp = metrics.cp
    now = [0.0]
    access = ScrapeAccess(NodeClient(metrics.node, str(metrics.kubeconfig)), ttl=60,
                          clock=lambda: now[0])
    cp.service_account(metrics.ns, "prometheus-k8s")
    metrics.bind(f"{metrics.ns}-reader", READER, "prometheus-k8s")
    until("the reader role reaches the authorizer",
          lambda: may_get_metrics(cp, metrics.ns, "prometheus-k8s"))
    token = f"Bearer {token_of(cp, metrics.ns, 'prometheus-k8s')}"
    assert access.check(token).status == 200
    cp.request("DELETE", f"{CLUSTERROLEBINDINGS}/{metrics.ns}-reader")
    until("the binding is gone from the authorizer",
          lambda: not may_get_metrics(cp, metrics.ns, "prometheus-k8s"))
    now[0] = 59.0
    assert access.check(token).status == 200  # kept
    now[0] = 61.0
    assert access.check(token).status == 403


def test_an_api_server_that_is_gone_is_a_503(metrics: Metrics, tmp_path: Path) -> None:
    # The installer's own pod-bound token, to a proxy that then goes away.
    token = json.loads(metrics.kubeconfig.read_text())["users"][0]["user"]["token"]
    with ApiProxy(metrics.cp, tmp_path / "gone-tls") as gone:
        kubeconfig = gone.kubeconfig(tmp_path / "gone", token)
        access = ScrapeAccess(NodeClient(metrics.node, str(kubeconfig)))
        reader = f"Bearer {token_of(metrics.cp, 'kube-system', READER)}"
        assert access.check(reader).status == 200  # the same setup answers while it is there
    assert access.check(f"Bearer {token_of(metrics.cp, 'kube-system', READER)}").status == 503
    assert [s.path.split("?")[0] for s in gone.seen] == [
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews"]


def test_the_server_answers_the_reviews_the_installer_sends_as_it_validates_them(
        metrics: Metrics) -> None:
    client = NodeClient(metrics.node, str(metrics.kubeconfig))
    # Neither a user nor a group: kube-apiserver's validation answers 422 Invalid.
    with pytest.raises(Exception, match="422"):
        client.subject_access_review({"username": ""}, "/metrics", "get")
    answer = client.token_review("made-up-token")
    assert not answer["status"].get("authenticated") and answer["status"]["error"]
    assert metrics.reviews() == [("subjectaccessreviews", 422), ("tokenreviews", 201)]


def test_the_metrics_command_without_credentials_refuses_to_start(tmp_path: Path) -> None:
    """No kubeconfig and not in a pod: exit 70 with the error's name, no traceback (no server
    is needed to show it: the command stops before any request)."""
    root = tmp_path / "host"
    make_host(root, distro="debian-12")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **root_env(root, NVIDIA_INSTALL_DIR_HOST="/var/lib/nvidia")}
    refused = subprocess.run(
        [sys.executable, "-m", "installer", "metrics", "--listen", f"127.0.0.1:{free_port()}",
         "--access", "tokenreview"], env=env, capture_output=True, text=True, timeout=60,
        check=False)
    assert refused.returncode == 70, refused.stderr
    assert "error[cluster-api-unavailable]" in refused.stderr
    assert "Traceback" not in refused.stderr
