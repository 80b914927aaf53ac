"""How the installer finds the API server and proves who it is (installer/cluster/credentials.py),
against the stand-in API server serving real HTTPS: the pod's service account (its token read
again on every request, as bound tokens rotate, and the cluster's CA), kubeconfig files in YAML
with inline or relative-path CA and client certificates, tls-server-name, and every malformed or
unsupported kubeconfig refused with a clear error before a request is made."""

from __future__ import annotations

import base64
import ipaddress
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from lib.tlskit import issue_certificate, new_key, write_key

from cluster.apiserver import ApiServer, Cluster
from installer.cluster import credentials
from installer.cluster.client import NodeClient
from installer.errors import ClusterApiForbidden, ClusterApiUnavailable, KubeconfigInvalid

NODE = "gpu-node-1"
SERVICE_NAME = "kubernetes.default.svc"


@dataclass
class Pki:
    """PEM files: a cluster CA, two API server certificates it signed (one for 127.0.0.1 and
    the service name, one for the service name alone), a client certificate, and a CA that
    signed none of them."""

    directory: Path

    def pem(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()

    def data(self, name: str) -> str:
        return base64.b64encode(self.pem(name)).decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca_key, other_key = new_key(), new_key()
    ca = issue_certificate("cluster-ca", ca_key, None)
    other = issue_certificate("another-ca", other_key, None)
    issued = {
        "server": [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName(SERVICE_NAME)],
        "server-by-name": [x509.DNSName(SERVICE_NAME)],
        "client": None,
    }
    for name, names in issued.items():
        key = new_key()
        certificate = issue_certificate(f"stand-in-{name}", key, (ca, ca_key), names)
        pem = certificate.public_bytes(serialization.Encoding.PEM)
        (directory / f"{name}.crt").write_bytes(pem)
        write_key(directory / f"{name}.key", key)
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "other-ca.crt").write_bytes(other.public_bytes(serialization.Encoding.PEM))
    return Pki(directory)


def _server_tls(pki: Pki, certificate: str = "server",
                client_certificates: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.directory / f"{certificate}.crt",
                            pki.directory / f"{certificate}.key")
    if client_certificates:
        # kube-apiserver's --client-ca-file: a certificate is asked for and verified when
        # given; a client without one still connects (Go's VerifyClientCertIfGiven).
        context.load_verify_locations(pki.directory / "ca.crt")
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


@pytest.fixture
def cluster() -> Cluster:
    cluster = Cluster()
    cluster.add_node(NODE, {"nvidia.com/gpu.present": "true"})
    return cluster


@pytest.fixture
def https(pki: Pki, cluster: Cluster) -> Iterator[ApiServer]:
    with ApiServer(cluster, tls=_server_tls(pki)) as server:
        yield server


def _kubeconfig(path: Path, cluster: str, user: str) -> Path:
    """A kubeconfig in YAML, as kubectl writes them (the `cluster` and `user` blocks are
    YAML mappings indented by 4)."""
    path.write_text(f"""apiVersion: v1
kind: Config
current-context: node
clusters:
- name: stand-in
  cluster:
{cluster}
contexts:
- name: elsewhere
  context: {{cluster: nowhere, user: nobody}}
- name: node
  context:
    cluster: stand-in
    user: installer
users:
- name: installer
  user:
{user}
""")
    return path


def test_a_yaml_kubeconfig_with_the_cluster_ca_inline_and_a_token(
        tmp_path: Path, pki: Pki, https: ApiServer) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config",
                             f"    server: {https.url}\n"
                             f"    certificate-authority-data: {pki.data('ca.crt')}",
                             "    token: stand-in-token")
    node = NodeClient(NODE, str(kubeconfig)).get_node()
    assert node["metadata"]["name"] == NODE
    assert [(r.method, r.path, r.status) for r in https.cluster.requests] == [
        ("GET", f"/api/v1/nodes/{NODE}", 200)]


def test_a_server_the_ca_did_not_sign_is_refused(tmp_path: Path, pki: Pki,
                                                 https: ApiServer) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config",
                             f"    server: {https.url}\n"
                             f"    certificate-authority-data: {pki.data('other-ca.crt')}",
                             "    token: stand-in-token")
    with pytest.raises(ClusterApiUnavailable, match=r"could not read node gpu-node-1: .*"
                       r"CERTIFICATE_VERIFY_FAILED") as caught:
        NodeClient(NODE, str(kubeconfig)).get_node()
    assert caught.value.exit_code == 70
    assert https.cluster.requests == []  # nothing was sent: the token never left


def test_a_wrong_token_is_forbidden(tmp_path: Path, pki: Pki, https: ApiServer) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config",
                             f"    server: {https.url}\n"
                             f"    certificate-authority-data: {pki.data('ca.crt')}",
                             "    token: stale")
    with pytest.raises(ClusterApiForbidden, match=r"answered 401 \(Unauthorized\)"):
        NodeClient(NODE, str(kubeconfig)).get_node()


def test_client_certificate_files_relative_to_the_kubeconfig(
        tmp_path: Path, pki: Pki, cluster: Cluster) -> None:
    """A kubelet's kubeconfig: CA, certificate and key as files beside it, no token; the
    server takes a client certificate its CA signed as the identity."""
    cluster.token = None  # the client certificate is the identity
    kubeconfig_dir = tmp_path / "etc-kubernetes"
    kubeconfig_dir.mkdir()
    for name in ("ca.crt", "client.crt", "client.key"):
        (kubeconfig_dir / name).write_bytes(pki.pem(name))
    with ApiServer(cluster, tls=_server_tls(pki, client_certificates=True)) as server:
        user = "    client-certificate: client.crt\n    client-key: client.key"
        kubeconfig = _kubeconfig(kubeconfig_dir / "kubelet.conf",
                                 f"    server: {server.url}\n    certificate-authority: ca.crt",
                                 user)
        assert NodeClient(NODE, str(kubeconfig)).get_node()["metadata"]["name"] == NODE
        # The same server answers a client without a certificate (or a token) 401.
        bare = _kubeconfig(kubeconfig_dir / "bare.conf",
                           f"    server: {server.url}\n    certificate-authority: ca.crt",
                           "    {}")
        with pytest.raises(ClusterApiForbidden, match=r"could not read node gpu-node-1: the "
                           r"API server answered 401 \(Unauthorized\)"):
            NodeClient(NODE, str(bare)).get_node()


def test_inline_client_certificate_leaves_no_key_on_disk(
        tmp_path: Path, pki: Pki, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.token = None
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with ApiServer(cluster, tls=_server_tls(pki, client_certificates=True)) as server:
        kubeconfig = _kubeconfig(
            tmp_path / "config",
            f"    server: {server.url}\n    certificate-authority-data: {pki.data('ca.crt')}",
            f"    client-certificate-data: {pki.data('client.crt')}\n"
            f"    client-key-data: {pki.data('client.key')}")
        assert NodeClient(NODE, str(kubeconfig)).get_node()["metadata"]["name"] == NODE
    assert list(scratch.iterdir()) == []


def test_tls_server_name_checks_the_certificate_against_that_name(
        tmp_path: Path, pki: Pki, cluster: Cluster) -> None:
    with ApiServer(cluster, tls=_server_tls(pki, "server-by-name")) as server:
        ca = f"    server: {server.url}\n    certificate-authority-data: {pki.data('ca.crt')}"
        plain = _kubeconfig(tmp_path / "plain", ca, "    token: stand-in-token")
        with pytest.raises(ClusterApiUnavailable, match="IP address mismatch"):
            NodeClient(NODE, str(plain)).get_node()
        named = _kubeconfig(tmp_path / "named", f"{ca}\n    tls-server-name: {SERVICE_NAME}",
                            "    token: stand-in-token")
        assert NodeClient(NODE, str(named)).get_node()["metadata"]["name"] == NODE


def test_in_cluster_reads_the_rotated_token_on_every_request(
        tmp_path: Path, pki: Pki, https: ApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(pki.pem("ca.crt"))
    (account / "token").write_text("stand-in-token\n")
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", https.url.rsplit(":", 1)[1])
    client = NodeClient(NODE, None)
    assert client.get_node()["metadata"]["name"] == NODE
    https.cluster.token = "rotated"  # the kubelet refreshed the projected token
    (account / "token").write_text("rotated\n")
    assert client.pods_on_node() == []


@pytest.mark.parametrize(("env", "files", "message"), [
    ({}, ("token", "ca.crt"), "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, ("ca.crt",),
     r"token does not exist \(the pod's service account token is not mounted"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "https"},
     ("token", "ca.crt"), "KUBERNETES_SERVICE_PORT='https' is not a port"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, ("token",),
     "could not load the API credentials: .*No such file"),
])
def test_in_cluster_without_what_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          pki: Pki, env: dict[str, str], files: tuple[str, ...],
                                          message: str) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    for name in files:
        (account / name).write_bytes(pki.pem("ca.crt") if name == "ca.crt" else b"t")
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT", account)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ClusterApiUnavailable, match=message) as caught:
        NodeClient(NODE, None)
    assert caught.value.exit_code == 70


@pytest.mark.parametrize(("cluster_block", "user_block", "message"), [
    ("    server: https://127.0.0.1:6443",
     "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n"
     "      command: gke-gcloud-auth-plugin",
     "user 'installer' authenticates with an exec plugin, which the installer does not run"),
    ("    server: https://127.0.0.1:6443",
     "    auth-provider:\n      name: gcp",
     "authenticates with an auth-provider plugin"),
    ("    server: 127.0.0.1:6443", "    token: t",
     r"cluster 'stand-in' has no http\(s\) server URL \(server: '127.0.0.1:6443'\)"),
    ("    server: https://127.0.0.1:99999", "    token: t", "server 'https://127.0.0.1:99999'"),
    ("    server: https://127.0.0.1:6443\n    certificate-authority-data: not*base64",
     "    token: t", "certificate-authority-data of cluster 'stand-in' is not base64"),
    ("    server: https://127.0.0.1:6443\n    certificate-authority: missing.crt",
     "    token: t", "could not load the API credentials: .*No such file"),
])
def test_a_kubeconfig_the_installer_cannot_use(tmp_path: Path, cluster_block: str,
                                               user_block: str, message: str) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config", cluster_block, user_block)
    with pytest.raises(ClusterApiUnavailable, match=message):
        NodeClient(NODE, str(kubeconfig))


@pytest.mark.parametrize(("text", "message"), [
    ("apiVersion: v1\nkind: Config\n", "has no current-context"),
    ("current-context: node\ncontexts: []\n", "has no context named 'node' in contexts"),
    ("current-context: [unclosed\n", "is neither YAML nor JSON"),
    ("- a list\n", "is not a kubeconfig"),
])
def test_a_malformed_kubeconfig(tmp_path: Path, text: str, message: str) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(text)
    with pytest.raises(ClusterApiUnavailable, match=message):
        NodeClient(NODE, str(kubeconfig))
    with pytest.raises(ClusterApiUnavailable, match=r"could not read kubeconfig .*absent"):
        NodeClient(NODE, str(tmp_path / "absent"))


def test_a_server_url_path_prefixes_every_request(tmp_path: Path, pki: Pki,
                                                  cluster: Cluster) -> None:
    """An API proxy's URL (Rancher's /k8s/clusters/<id>): the stand-in serves only /api/v1,
    so the prefix must reach it and comes back as the 404 it does not serve."""
    with ApiServer(cluster, tls=_server_tls(pki)) as server:
        kubeconfig = _kubeconfig(tmp_path / "config",
                                 f"    server: {server.url}/k8s/clusters/c-1/\n"
                                 f"    certificate-authority-data: {pki.data('ca.crt')}",
                                 "    token: stand-in-token")
        with pytest.raises(ClusterApiUnavailable, match="the stand-in does not serve GET "
                           "/k8s/clusters/c-1/api/v1/pods"):
            NodeClient(NODE, str(kubeconfig)).pods_on_node()
        assert [r.path for r in cluster.requests] == ["/k8s/clusters/c-1/api/v1/pods"]


@pytest.mark.parametrize("value", ['"false"', "'true'", '"no"', "0", "1", "[true]", "{}",
                                   '""'])
def test_insecure_skip_tls_verify_must_be_a_yaml_boolean(tmp_path: Path, pki: Pki,
                                                         https: ApiServer, value: str) -> None:
    """kubectl refuses anything but a boolean there; a quoted "false" once turned verification
    off (a non-empty string is truthy). Refused before a connection is made."""
    kubeconfig = _kubeconfig(tmp_path / "config",
                             f"    server: {https.url}\n"
                             f"    certificate-authority-data: {pki.data('other-ca.crt')}\n"
                             f"    insecure-skip-tls-verify: {value}",
                             "    token: stand-in-token")
    with pytest.raises(KubeconfigInvalid, match=(
            rf"kubeconfig {tmp_path}/config: insecure-skip-tls-verify of cluster 'stand-in' is "
            r".*, not a boolean: write insecure-skip-tls-verify: true or false, without quotes"
    )) as caught:
        NodeClient(NODE, str(kubeconfig))
    assert caught.value.exit_code == 100
    assert caught.value.hint and "kubeconfig" in caught.value.hint
    assert https.cluster.requests == []


@pytest.mark.parametrize(("flag", "verifies"), [("false", True), (None, True), ("true", False)])
def test_insecure_skip_tls_verify_booleans(tmp_path: Path, pki: Pki, https: ApiServer,
                                           flag: str | None, verifies: bool) -> None:
    """`false` and absent verify the server against the CA (here one that did not sign it);
    `true` is honoured as kubectl honours it."""
    line = f"\n    insecure-skip-tls-verify: {flag}" if flag else ""
    kubeconfig = _kubeconfig(tmp_path / "config",
                             f"    server: {https.url}\n"
                             f"    certificate-authority-data: {pki.data('other-ca.crt')}{line}",
                             "    token: stand-in-token")
    client = NodeClient(NODE, str(kubeconfig))
    if verifies:
        with pytest.raises(ClusterApiUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            client.get_node()
        assert https.cluster.requests == []
    else:
        assert client.get_node()["metadata"]["name"] == NODE


@pytest.mark.parametrize(("cluster_block", "user_block", "message"), [
    ("    server: https://127.0.0.1:6443\n    certificate-authority-data: 12345",
     "    token: t", "certificate-authority-data of cluster 'stand-in' is 12345 "
     r"\(a number\), not a string"),
    ("    server: https://127.0.0.1:6443\n    certificate-authority: [ca.crt]",
     "    token: t", r"certificate-authority of cluster 'stand-in' is \['ca.crt'\] \(a list\), "
     "not a string"),
    ("    server: https://127.0.0.1:6443\n    tls-server-name: 7",
     "    token: t", "tls-server-name of cluster 'stand-in' is 7"),
    ("    server: [https://127.0.0.1:6443]", "    token: t",
     "server of cluster 'stand-in' is .* not a string"),
    ("    server: https://127.0.0.1:6443", "    token: 12345",
     "token of user 'installer' is a number, not a string"),
    ("    server: https://127.0.0.1:6443", "    client-key-data: {a: b}",
     "client-key-data of user 'installer' is a mapping, not a string"),
    ("    server: https://127.0.0.1:6443", "    tokenFile: true",
     r"tokenFile of user 'installer' is True \(a boolean\), not a string"),
    ("    server: https://127.0.0.1:6443", "    client-certificate-data: 'not base64!'",
     "client-certificate-data of user 'installer' is not base64"),
])
def test_kubeconfig_fields_of_the_wrong_type(tmp_path: Path, cluster_block: str,
                                             user_block: str, message: str) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config", cluster_block, user_block)
    with pytest.raises(KubeconfigInvalid, match=message) as caught:
        NodeClient(NODE, str(kubeconfig))
    assert caught.value.exit_code == 100


@pytest.mark.parametrize(("text", "message"), [
    ("current-context: node\nclusters: 5\ncontexts: []\n", r"clusters is 5 \(a number\), not "
     "a list"),
    ("current-context: node\ncontexts: {node: {cluster: c}}\n", r"contexts is .* \(a mapping\), "
     "not a list"),
    ("current-context: [node]\ncontexts: []\n", r"current-context is \['node'\] \(a list\), "
     "not a string"),
    ("current-context: node\ncontexts:\n- name: node\n  context: [c]\n",
     r"context 'node' in contexts is \['c'\] \(a list\), not a mapping"),
    ("current-context: node\ncontexts:\n- name: node\n  context: {cluster: c}\n"
     "clusters:\n- name: c\n  cluster: https://127.0.0.1:6443\n",
     r"cluster 'c' in clusters is 'https://127.0.0.1:6443' \(a string\), not a mapping"),
    ("current-context: node\ncontexts:\n- name: node\n  context: {cluster: c, user: 5}\n"
     "clusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443'}\n",
     r"user of context 'node' is 5 \(a number\), not a string"),
])
def test_kubeconfig_structure_of_the_wrong_shape(tmp_path: Path, text: str,
                                                 message: str) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(text)
    with pytest.raises(KubeconfigInvalid, match=message) as caught:
        NodeClient(NODE, str(kubeconfig))
    assert caught.value.exit_code == 100
