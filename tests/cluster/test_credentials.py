"""How the installer finds the API server and proves who it is (installer/cluster/credentials.py),
against the real kube-apiserver (tests/lib/controlplane.py), directly or through
tests/lib/apiproxy.py presenting the server certificate a case needs: the pod's service account
(its token, from the TokenRequest API, read again on every request, as bound tokens rotate, and
the cluster's CA), kubeconfig files in YAML with inline or relative-path CA and client
certificates the server verifies itself, tls-server-name, and every malformed or unsupported
kubeconfig refused with a clear error before a request is made (those need no server)."""

from __future__ import annotations

import base64
import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from lib.apiproxy import ApiProxy
from lib.controlplane import ApiError, ControlPlane
from lib.tlskit import issue_certificate, issue_client_certificate, new_key, write_key

from installer.cluster import credentials
from installer.cluster.client import NodeClient
from installer.errors import ClusterApiForbidden, ClusterApiUnavailable, KubeconfigInvalid

NODE = "gpu-node-1"  # in the cases that make no request
SERVICE_NAME = "kubernetes.default.svc"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
CLUSTERROLEBINDINGS = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"


@dataclass
class Pki:
    """PEM files that are no cluster's: a CA and a server certificate it signed for the
    service name alone (not 127.0.0.1), and a CA that signed nothing here."""

    directory: Path

    def pem(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()

    def data(self, name: str) -> str:
        return base64.b64encode(self.pem(name)).decode()

    def chain(self, name: str) -> tuple[Path, Path]:
        return self.directory / f"{name}.crt", self.directory / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca_key, other_key, server_key = new_key(), new_key(), new_key()
    ca = issue_certificate("cluster-ca", ca_key, None)
    other = issue_certificate("another-ca", other_key, None)
    server = issue_certificate("api-by-name", server_key, (ca, ca_key),
                               [x509.DNSName(SERVICE_NAME)])
    for name, cert in (("ca", ca), ("other-ca", other), ("server-by-name", server)):
        (directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_key(directory / "server-by-name.key", server_key)
    return Pki(directory)


@dataclass
class Reader:
    """A ServiceAccount allowed to get Nodes and list Pods (a ClusterRole of this module's,
    bound and seen by the authorizer), and a Node of this module's for its pod."""

    cp: ControlPlane
    namespace: str
    account: str
    node: str

    def token(self, pod: str = "main") -> str:
        """A TokenRequest token bound to a Pod of the account on the node (a fresh token
        each call; the Pod is made once)."""
        return self.cp.pod_token(self.node, account=self.account, namespace=self.namespace,
                                 pod=f"{self.account}-{pod}")


@pytest.fixture(scope="module")
def reader(control_plane: ControlPlane) -> Iterator[Reader]:
    cp = control_plane
    suffix = uuid.uuid4().hex[:8]
    name = f"credentials-{suffix}"
    r = Reader(cp, cp.namespace(name), "installer", f"{name}-node")
    cp.node(r.node)
    cp.service_account(r.namespace, r.account)
    cp.create(CLUSTERROLES, {"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
    cp.create(CLUSTERROLEBINDINGS, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": r.account, "namespace": r.namespace}]})
    try:
        deadline = time.monotonic() + 30
        while not cp.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {"spec": {
                "user": f"system:serviceaccount:{r.namespace}:{r.account}",
                "resourceAttributes": {"verb": "list", "resource": "pods"}}})["status"].get(
                    "allowed"):
            assert time.monotonic() < deadline, "the binding never reached the authorizer"
            time.sleep(0.1)
        yield r
    finally:
        with contextlib.suppress(ApiError):  # no kubelet to wait for: gone at once
            cp.request("DELETE", f"/api/v1/namespaces/{r.namespace}/pods/{r.account}-main",
                       {"gracePeriodSeconds": 0})
        for path in (f"{CLUSTERROLEBINDINGS}/{name}", f"{CLUSTERROLES}/{name}",
                     f"/api/v1/nodes/{r.node}"):
            with contextlib.suppress(ApiError):
                cp.request("DELETE", path)


@pytest.fixture
def proxy(reader: Reader, tmp_path: Path) -> Iterator[ApiProxy]:
    """The real server behind a certificate of the proxy's own CA (proxy.tls.ca_file)."""
    with ApiProxy(reader.cp, tmp_path / "proxy-tls") as p:
        yield p


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


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _requests(proxy: ApiProxy) -> list[tuple[str, str, int]]:
    return [(s.method, s.path, s.status) for s in proxy.seen]


def test_a_yaml_kubeconfig_with_the_cluster_ca_inline_and_a_token(
        tmp_path: Path, reader: Reader, proxy: ApiProxy) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config",
                             f"    server: {proxy.url}\n"
                             f"    certificate-authority-data: {_b64(proxy.tls.ca_file)}",
                             f"    token: {reader.token()}")
    node = NodeClient(reader.node, str(kubeconfig)).get_node()
    assert node["metadata"]["name"] == reader.node
    assert _requests(proxy) == [("GET", f"/api/v1/nodes/{reader.node}", 200)]


def test_a_server_the_ca_did_not_sign_is_refused(tmp_path: Path, pki: Pki, reader: Reader,
                                                 proxy: ApiProxy) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config",
                             f"    server: {proxy.url}\n"
                             f"    certificate-authority-data: {pki.data('other-ca.crt')}",
                             f"    token: {reader.token()}")
    with pytest.raises(ClusterApiUnavailable, match=rf"could not read node {reader.node}: .*"
                       r"CERTIFICATE_VERIFY_FAILED") as caught:
        NodeClient(reader.node, str(kubeconfig)).get_node()
    assert caught.value.exit_code == 70
    assert proxy.seen == []  # nothing was sent: the token never left


def test_a_wrong_token_is_refused_by_the_server(tmp_path: Path, reader: Reader,
                                                proxy: ApiProxy) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config",
                             f"    server: {proxy.url}\n"
                             f"    certificate-authority-data: {_b64(proxy.tls.ca_file)}",
                             "    token: stale")
    with pytest.raises(ClusterApiForbidden, match=r"answered 401 \(Unauthorized\)"):
        NodeClient(reader.node, str(kubeconfig)).get_node()
    assert _requests(proxy) == [("GET", f"/api/v1/nodes/{reader.node}", 401)]


def _client_certificate(cp: ControlPlane, directory: Path, user: str, groups: list[str],
                        *, signed_by_cluster: bool = True) -> tuple[Path, Path]:
    """A client certificate and key for `user` in `groups`, signed by the control plane's
    client CA (its --client-ca-file) or by a CA of its own."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    if signed_by_cluster:
        issuer_key = load_pem_private_key((cp.dir / "ca.key").read_bytes(), None)
        issuer = (x509.load_pem_x509_certificate(cp.ca.read_bytes()), issuer_key)
    else:
        own_key = new_key()
        issuer = (issue_certificate("not-the-cluster-ca", own_key, None), own_key)
    key = new_key()
    cert = issue_client_certificate(user, groups, key, issuer)  # type: ignore[arg-type]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "client.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_key(directory / "client.key", key)
    return directory / "client.crt", directory / "client.key"


def test_client_certificate_files_relative_to_the_kubeconfig(
        tmp_path: Path, reader: Reader) -> None:
    """A kubelet's kubeconfig: CA, certificate and key as files beside it, no token; the real
    server verifies the certificate against its client CA and takes its subject as the user
    (system:node:<name>, whom the Node authorizer lets read its own Node)."""
    cp = reader.cp
    kubeconfig_dir = tmp_path / "etc-kubernetes"
    _client_certificate(cp, kubeconfig_dir, f"system:node:{reader.node}", ["system:nodes"])
    (kubeconfig_dir / "ca.crt").write_bytes(cp.ca.read_bytes())
    cluster = f"    server: {cp.url}\n    certificate-authority: ca.crt"
    kubeconfig = _kubeconfig(kubeconfig_dir / "kubelet.conf", cluster,
                             "    client-certificate: client.crt\n    client-key: client.key")
    node = NodeClient(reader.node, str(kubeconfig)).get_node()
    assert node["metadata"]["name"] == reader.node
    # The same server takes a client without a certificate (or a token) as system:anonymous,
    # whom it refuses the Node.
    bare = _kubeconfig(kubeconfig_dir / "bare.conf", cluster, "    {}")
    with pytest.raises(ClusterApiForbidden, match=rf"could not read node {reader.node}: the "
                       r"API server answered 403 \(.*User \"system:anonymous\" cannot get "
                       r"resource \"nodes\""):
        NodeClient(reader.node, str(bare)).get_node()
    # A certificate its client CA did not sign: the server takes it for no one, not even
    # system:anonymous.
    _client_certificate(cp, tmp_path / "forged", f"system:node:{reader.node}", ["system:nodes"],
                        signed_by_cluster=False)
    forged = _kubeconfig(tmp_path / "forged" / "kubelet.conf",
                         f"    server: {cp.url}\n"
                         f"    certificate-authority-data: {_b64(cp.ca)}",
                         "    client-certificate: client.crt\n    client-key: client.key")
    with pytest.raises(ClusterApiForbidden, match=rf"could not read node {reader.node}: the "
                       r"API server answered 401 \(Unauthorized\)"):
        NodeClient(reader.node, str(forged)).get_node()


def test_inline_client_certificate_leaves_no_key_on_disk(
        tmp_path: Path, reader: Reader, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = reader.cp
    cert, key = _client_certificate(cp, tmp_path / "pem", f"system:node:{reader.node}",
                                    ["system:nodes"])
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    kubeconfig = _kubeconfig(
        tmp_path / "config",
        f"    server: {cp.url}\n    certificate-authority-data: {_b64(cp.ca)}",
        f"    client-certificate-data: {_b64(cert)}\n    client-key-data: {_b64(key)}")
    node = NodeClient(reader.node, str(kubeconfig)).get_node()
    assert node["metadata"]["name"] == reader.node
    assert list(scratch.iterdir()) == []


def test_tls_server_name_checks_the_certificate_against_that_name(
        tmp_path: Path, pki: Pki, reader: Reader) -> None:
    with ApiProxy(reader.cp, tmp_path / "proxy-tls",
                  certificate=pki.chain("server-by-name")) as proxy:
        ca = f"    server: {proxy.url}\n    certificate-authority-data: {pki.data('ca.crt')}"
        token = f"    token: {reader.token()}"
        plain = _kubeconfig(tmp_path / "plain", ca, token)
        with pytest.raises(ClusterApiUnavailable, match="IP address mismatch"):
            NodeClient(reader.node, str(plain)).get_node()
        assert proxy.seen == []
        named = _kubeconfig(tmp_path / "named", f"{ca}\n    tls-server-name: {SERVICE_NAME}",
                            token)
        node = NodeClient(reader.node, str(named)).get_node()
        assert node["metadata"]["name"] == reader.node
        assert _requests(proxy) == [("GET", f"/api/v1/nodes/{reader.node}", 200)]


def test_in_cluster_reads_the_rotated_token_on_every_request(
        tmp_path: Path, reader: Reader, proxy: ApiProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubelet rotates the projected token (a second TokenRequest): the next request
    carries the new one, and the server takes it."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(proxy.tls.ca_file.read_bytes())
    first = reader.token()
    (account / "token").write_text(first + "\n")
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", proxy.url.rsplit(":", 1)[1])
    client = NodeClient(reader.node, None)
    assert client.get_node()["metadata"]["name"] == reader.node
    rotated = reader.token()
    assert rotated != first
    (account / "token").write_text(rotated + "\n")
    pods = [p["metadata"]["name"] for p in client.pods_on_node()]
    assert pods == [f"{reader.account}-main"]  # the server's answer for this node
    assert [(s.status, s.bearer) for s in proxy.seen] == [(200, first), (200, rotated)]


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


def test_a_server_url_path_prefixes_every_request(tmp_path: Path, reader: Reader,
                                                  proxy: ApiProxy) -> None:
    """An API proxy's URL (Rancher's /k8s/clusters/<id>): kube-apiserver serves no such
    prefix, so the prefix must reach it and comes back as the path the account may not get."""
    kubeconfig = _kubeconfig(tmp_path / "config",
                             f"    server: {proxy.url}/k8s/clusters/c-1/\n"
                             f"    certificate-authority-data: {_b64(proxy.tls.ca_file)}",
                             f"    token: {reader.token()}")
    with pytest.raises(ClusterApiForbidden, match=r"answered 403 \(forbidden: User .* cannot "
                       r"get path \"/k8s/clusters/c-1/api/v1/pods\"\)"):
        NodeClient(reader.node, str(kubeconfig)).pods_on_node()
    assert [(s.path.split("?")[0], s.status) for s in proxy.seen] == [
        ("/k8s/clusters/c-1/api/v1/pods", 403)]


@pytest.mark.parametrize("value", ['"false"', "'true'", '"no"', "0", "1", "[true]", "{}",
                                   '""'])
def test_insecure_skip_tls_verify_must_be_a_yaml_boolean(tmp_path: Path, pki: Pki,
                                                         value: str) -> None:
    """kubectl refuses anything but a boolean there; a quoted "false" once turned verification
    off (a non-empty string is truthy). Refused while the client is made, before any
    connection (no server listens at that port)."""
    kubeconfig = _kubeconfig(tmp_path / "config",
                             "    server: https://127.0.0.1:6443\n"
                             f"    certificate-authority-data: {pki.data('other-ca.crt')}\n"
                             f"    insecure-skip-tls-verify: {value}",
                             "    token: some-token")
    with pytest.raises(KubeconfigInvalid, match=(
            rf"kubeconfig {tmp_path}/config: insecure-skip-tls-verify of cluster 'stand-in' is "
            r".*, not a boolean: write insecure-skip-tls-verify: true or false, without quotes"
    )) as caught:
        NodeClient(NODE, str(kubeconfig))
    assert caught.value.exit_code == 100
    assert caught.value.hint and "kubeconfig" in caught.value.hint


@pytest.mark.parametrize(("flag", "verifies"), [("false", True), (None, True), ("true", False)])
def test_insecure_skip_tls_verify_booleans(tmp_path: Path, pki: Pki, reader: Reader,
                                           proxy: ApiProxy, flag: str | None,
                                           verifies: bool) -> None:
    """`false` and absent verify the server against the CA (here one that did not sign it);
    `true` is honoured as kubectl honours it."""
    line = f"\n    insecure-skip-tls-verify: {flag}" if flag else ""
    kubeconfig = _kubeconfig(tmp_path / "config",
                             f"    server: {proxy.url}\n"
                             f"    certificate-authority-data: {pki.data('other-ca.crt')}{line}",
                             f"    token: {reader.token()}")
    client = NodeClient(reader.node, str(kubeconfig))
    if verifies:
        with pytest.raises(ClusterApiUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            client.get_node()
        assert proxy.seen == []
    else:
        assert client.get_node()["metadata"]["name"] == reader.node
        assert _requests(proxy) == [("GET", f"/api/v1/nodes/{reader.node}", 200)]


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
