"""`installer metrics --access tokenreview` against the stand-in API server: a scraper's bearer
token is checked with an authentication.k8s.io/v1 TokenReview, its user with an
authorization.k8s.io/v1 SubjectAccessReview for get on the non-resource URL /metrics (as
kube-rbac-proxy does), both asked as the installer's account with exactly the RBAC the
metrics-auth component ships; answers are kept briefly; an API server that cannot answer is a
503 that is not kept."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from lib.hosttrees import make_host, root_env

from cluster.apiserver import ApiServer, Cluster, cluster_role_rules
from installer.cluster.access import ScrapeAccess
from installer.cluster.client import NodeClient
from installer.metrics import exporter
from installer.metrics.snapshot import Snapshot

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "daemonset" / "components" / "metrics-auth" / "rbac.yaml"
PROMETHEUS = {"username": "system:serviceaccount:monitoring:prometheus-k8s",
              "uid": "5b0c0b1e-prom", "groups": ["system:serviceaccounts",
                                                 "system:serviceaccounts:monitoring",
                                                 "system:authenticated"]}
STRANGER = {"username": "system:serviceaccount:default:gpu-job", "uid": "77aa-job",
            "groups": ["system:serviceaccounts", "system:authenticated"]}
TOKENS = {"prometheus-token": PROMETHEUS, "stranger-token": STRANGER}


def snap() -> Snapshot:
    return Snapshot(driver_ready=True, node_ready=True, installed=None, last_run={}, daemons={},
                    restarts={}, fabric_required=False, gpus=())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("WWW-Authenticate", "")


def reviews(cluster: Cluster) -> list[tuple[str, int, object]]:
    with cluster.lock:
        return [(r.path.rsplit("/", 1)[1], r.status, r.body) for r in cluster.requests
                if r.path.endswith("reviews")]


def reader_cluster(rules: list[dict[str, object]] | None = None) -> Cluster:
    """The shipped reader role bound to Prometheus's account (as docs/metrics.md says to);
    the installer's own account holds the shipped review role."""
    cluster = Cluster(rules=rules if rules is not None else cluster_role_rules(RBAC),
                      client_tokens=dict(TOKENS))
    cluster.url_grants.add((PROMETHEUS["username"], "get", "/metrics"))
    return cluster


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Cluster, ApiServer, int]]:
    cluster = reader_cluster()
    with ApiServer(cluster) as api:
        access = ScrapeAccess(NodeClient("", str(api.kubeconfig(tmp_path))))
        port = free_port()
        stop = exporter.start(snap, f"127.0.0.1:{port}", access)
        try:
            yield cluster, api, port
        finally:
            stop()


def test_a_scrape_without_a_token_the_api_server_knows_is_refused(
        served: tuple[Cluster, ApiServer, int]) -> None:
    cluster, _api, port = served
    status, challenge = scrape(port)
    assert (status, challenge) == (401, 'Bearer realm="nvidia-driver-installer"')
    assert reviews(cluster) == []  # nothing to ask without a token
    assert scrape(port, "made-up-token")[0] == 401
    [(kind, code, body)] = reviews(cluster)
    assert (kind, code) == ("tokenreviews", 201)
    assert body == {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                    "spec": {"token": "made-up-token"}}


def test_a_known_user_without_the_grant_is_forbidden(
        served: tuple[Cluster, ApiServer, int]) -> None:
    cluster, _api, port = served
    assert scrape(port, "stranger-token")[0] == 403
    kinds = [(kind, code) for kind, code, _ in reviews(cluster)]
    assert kinds == [("tokenreviews", 201), ("subjectaccessreviews", 201)]
    sar = reviews(cluster)[1][2]
    assert sar == {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                   "spec": {"user": STRANGER["username"], "uid": STRANGER["uid"],
                            "groups": STRANGER["groups"],
                            "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}


def test_prometheus_reads_the_metrics_and_its_answer_is_kept(
        served: tuple[Cluster, ApiServer, int]) -> None:
    cluster, _api, port = served
    status, body = scrape(port, "prometheus-token")
    assert status == 200 and "nvidia_driver_installer_driver_ready 1.0" in body.splitlines()
    for _ in range(3):
        assert scrape(port, "prometheus-token")[0] == 200
    # One TokenReview and one SubjectAccessReview for four scrapes.
    assert [kind for kind, _, _ in reviews(cluster)] == ["tokenreviews", "subjectaccessreviews"]


def test_an_answer_is_asked_again_once_it_expires(tmp_path: Path) -> None:
    now = [0.0]
    cluster = reader_cluster()
    with ApiServer(cluster) as api:
        access = ScrapeAccess(NodeClient("", str(api.kubeconfig(tmp_path))), ttl=60,
                              clock=lambda: now[0])
        assert access.check("Bearer prometheus-token").status == 200
        cluster.url_grants.clear()  # the binding is removed
        now[0] = 59.0
        assert access.check("Bearer prometheus-token").status == 200
        now[0] = 61.0
        assert access.check("Bearer prometheus-token").status == 403
    assert len(reviews(cluster)) == 4


def test_the_api_server_refusing_the_review_is_a_503_not_kept(tmp_path: Path) -> None:
    # The installer's account without the shipped review role: the API server answers 403.
    cluster = reader_cluster(rules=[{"apiGroups": [""], "resources": ["nodes"],
                                     "verbs": ["get"]}])
    with ApiServer(cluster) as api:
        access = ScrapeAccess(NodeClient("", str(api.kubeconfig(tmp_path))))
        assert access.check("Bearer prometheus-token").status == 503
        cluster.rules = cluster_role_rules(RBAC)  # the role is bound
        assert access.check("Bearer prometheus-token").status == 200
    assert [code for _, code, _ in reviews(cluster)] == [403, 201, 201]


def test_an_api_server_that_is_gone_is_a_503(tmp_path: Path) -> None:
    cluster = reader_cluster()
    with ApiServer(cluster) as api:
        kubeconfig = api.kubeconfig(tmp_path)
    access = ScrapeAccess(NodeClient("", str(kubeconfig)))
    assert access.check("Bearer prometheus-token").status == 503


def test_the_stand_in_refuses_a_review_the_real_api_server_refuses(tmp_path: Path) -> None:
    cluster = reader_cluster()
    with ApiServer(cluster) as api:
        client = NodeClient("", str(api.kubeconfig(tmp_path)))
        # Neither a user nor a group: 422 Invalid, as kube-apiserver's validation answers.
        with pytest.raises(Exception, match="422"):
            client.subject_access_review({"username": ""}, "/metrics", "get")
        answer = client.token_review("made-up-token")
    assert "authenticated" not in answer["status"] and answer["status"]["error"]


def test_the_metrics_command_checks_scrapers_with_the_api_server(tmp_path: Path) -> None:
    """`installer metrics --access tokenreview` as the container runs it, asking the stand-in
    with the kubeconfig's credentials; without any, it refuses to start (no traceback)."""
    root = tmp_path / "host"
    make_host(root, distro="debian-12")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **root_env(root, NVIDIA_INSTALL_DIR_HOST="/var/lib/nvidia")}
    port = free_port()
    argv = [sys.executable, "-m", "installer", "metrics", "--listen", f"127.0.0.1:{port}",
            "--access", "tokenreview"]
    refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                             check=False)
    assert refused.returncode == 70, refused.stderr
    assert "error[cluster-api-unavailable]" in refused.stderr
    assert "Traceback" not in refused.stderr
    cluster = reader_cluster()
    with ApiServer(cluster) as api:
        env["NVIDIA_INSTALLER_KUBECONFIG"] = str(api.kubeconfig(tmp_path))
        exporter_process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    status, _ = scrape(port)
                    break
                except OSError:
                    assert exporter_process.poll() is None
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            assert status == 401
            assert scrape(port, "stranger-token")[0] == 403
            status, body = scrape(port, "prometheus-token")
            assert status == 200 and "nvidia_driver_installer_record_valid" in body
        finally:
            exporter_process.terminate()
            exporter_process.wait(15)
