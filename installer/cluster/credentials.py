"""Where the API server is and how to prove who we are: the pod's service account (in-cluster)
or a kubeconfig file. Only what a node-side tool meets: bearer tokens (inline or a file read
again on every request, as bound tokens rotate), client certificates, the cluster's CA. A
kubeconfig user that authenticates through an exec plugin or an auth provider is refused with
a clear error: the installer runs no program named by a kubeconfig."""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from installer.errors import ClusterApiUnavailable, KubeconfigInvalid

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Credentials:
    """One API server and the identity to use with it."""

    scheme: str  # "https" or "http"
    host: str
    port: int
    base_path: str  # a server URL's path (an API proxy's prefix), "" usually
    token: str | None = None
    token_file: Path | None = None
    tls: ssl.SSLContext | None = None
    server_name: str | None = None  # tls-server-name: the name the certificate must carry

    def bearer(self) -> str | None:
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError as exc:
                raise ClusterApiUnavailable(
                    f"could not read the API token {self.token_file}: {exc.strerror}") from exc
        return self.token


def load(kubeconfig: str | None) -> Credentials:
    """The kubeconfig's current context, or without one the pod's service account. Raises
    ClusterApiUnavailable naming what is missing or malformed."""
    return _from_kubeconfig(Path(kubeconfig)) if kubeconfig else _in_cluster()


def _in_cluster() -> Credentials:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    token = SERVICE_ACCOUNT / "token"
    if not host or not port:
        raise ClusterApiUnavailable(
            "could not find the API server: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
            "are not set (not in a pod? set NVIDIA_INSTALLER_KUBECONFIG)")
    if not token.is_file():
        raise ClusterApiUnavailable(
            f"could not load the API credentials: {token} does not exist (the pod's service "
            "account token is not mounted: automountServiceAccountToken)")
    return Credentials("https", host, _port(port, "KUBERNETES_SERVICE_PORT"), "",
                       token_file=token,
                       tls=_tls_context(ca_file=SERVICE_ACCOUNT / "ca.crt"))


def _from_kubeconfig(path: Path) -> Credentials:
    where = f"kubeconfig {path}"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ClusterApiUnavailable(f"could not read {where}: {exc.strerror}") from exc
    document = _parse(text, where)
    for section in ("clusters", "contexts", "users"):
        if document.get(section) is not None and not isinstance(document[section], list):
            raise KubeconfigInvalid(f"{where}: {section} is {_shown(document[section])}, not a "
                                    f"list: write {section}: as a list of entries, "
                                    "`- name: ...`")
    context_name = _text(document, "current-context", where, "")
    if not context_name:
        raise KubeconfigInvalid(f"{where} has no current-context")
    context = _named(document, "contexts", "context", context_name, where)
    cluster_name = _text(context, "cluster", where, f" of context {context_name!r}")
    user_name = _text(context, "user", where, f" of context {context_name!r}")
    cluster = _named(document, "clusters", "cluster", cluster_name, where)
    user = _named(document, "users", "user", user_name, where) if user_name else {}
    of_cluster, of_user = f" of cluster {cluster_name!r}", f" of user {user_name!r}"
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise KubeconfigInvalid(
                f"{where}: user {user_name!r} authenticates with an {plugin} plugin, "
                "which the installer does not run: give it a kubeconfig with a token, a token "
                "file or a client certificate (a ServiceAccount's token: kubectl create token)")
    server = _text(cluster, "server", where, of_cluster) or ""
    url = urlsplit(server)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise KubeconfigInvalid(f"{where}: cluster {cluster_name!r} has no "
                                f"http(s) server URL (server: {server!r})")
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError as exc:
        raise KubeconfigInvalid(f"{where}: server {server!r}: {exc}") from exc
    base = path.parent
    # Every field is read (and its type checked) whatever the scheme: a mistake is reported
    # the day it is made, not the day the server moves to https.
    ca_file = _file(cluster, "certificate-authority", base, where, of_cluster)
    ca_data = _data(cluster, "certificate-authority-data", where, of_cluster)
    insecure = _flag(cluster, "insecure-skip-tls-verify", where, of_cluster)
    server_name = _text(cluster, "tls-server-name", where, of_cluster)
    cert_file = _file(user, "client-certificate", base, where, of_user)
    cert_data = _data(user, "client-certificate-data", where, of_user)
    key_file = _file(user, "client-key", base, where, of_user)
    key_data = _data(user, "client-key-data", where, of_user)
    token = _text(user, "token", where, of_user, secret=True)
    token_file = _file(user, "tokenFile", base, where, of_user)
    tls = None
    if url.scheme == "https":
        tls = _tls_context(ca_file=ca_file, ca_data=ca_data, insecure=insecure,
                           cert_file=cert_file, cert_data=cert_data, key_file=key_file,
                           key_data=key_data)
    return Credentials(url.scheme, url.hostname, port, url.path.rstrip("/"),
                       token=token or None, token_file=token_file, tls=tls,
                       server_name=server_name or None)


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except ValueError:
        import yaml  # kubeconfigs are YAML; JSON (a subset) needs no parser import

        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise KubeconfigInvalid(f"{where} is neither YAML nor JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise KubeconfigInvalid(f"{where} is not a kubeconfig (no mapping at its top)")
    return document


def _named(document: dict[str, Any], section: str, key: str, name: str | None,
           where: str) -> dict[str, Any]:
    for entry in document.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key)
            if value is None:
                return {}
            if not isinstance(value, dict):
                raise KubeconfigInvalid(f"{where}: {key} {name!r} in {section} is "
                                        f"{_shown(value)}, not a mapping: write its fields "
                                        f"under `{key}:`, one `field: value` a line")
            return value
    raise KubeconfigInvalid(f"{where} has no {key} named {name!r} in {section}")


_KINDS = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"),
          (list, "a list"), (dict, "a mapping"))


def _shown(value: Any, secret: bool = False) -> str:
    """A value as the message shows it, with its YAML kind: `'false' (a string)`; of a
    credential, its kind alone."""
    kind = next((name for type_, name in _KINDS if isinstance(value, type_)), "a value")
    return kind if secret else f"{repr(value)[:80]} ({kind})"


def _text(section: dict[str, Any], key: str, where: str, of: str,
          secret: bool = False) -> str | None:
    """A string field; None when absent or null. Anything else is refused, as kubectl
    refuses it: a number or a list there is a mistake, not a value to guess at."""
    value = section.get(key)
    if value is None or isinstance(value, str):
        return value
    raise KubeconfigInvalid(f"{where}: {key}{of} is {_shown(value, secret)}, not a string: write "
                            f"{key}: \"<text>\"")


def _flag(section: dict[str, Any], key: str, where: str, of: str) -> bool:
    """A boolean field: a YAML (or JSON) true or false; absent or null is false. A string is
    refused, whatever it says: "false" is a non-empty string, and treating it as true once
    switched TLS verification off."""
    value = section.get(key)
    if value is None or isinstance(value, bool):
        return bool(value)
    raise KubeconfigInvalid(f"{where}: {key}{of} is {_shown(value)}, not a boolean: write "
                            f"{key}: true or false, without quotes")


def _file(section: dict[str, Any], key: str, base: Path, where: str, of: str) -> Path | None:
    value = _text(section, key, where, of)
    return base / value if value else None  # relative paths are the kubeconfig's


def _data(section: dict[str, Any], key: str, where: str, of: str) -> bytes | None:
    value = _text(section, key, where, of, secret=key == "client-key-data")
    if not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise KubeconfigInvalid(f"{where}: {key}{of} is not base64: write the PEM file's "
                                f"base64 there (base64 -w0 <file>)") from exc


def _port(value: str, name: str) -> int:
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise ClusterApiUnavailable(f"{name}={value!r} is not a port")
    return port


def _tls_context(*, ca_file: Path | None = None, ca_data: bytes | None = None,
                 insecure: bool = False, cert_file: Path | None = None,
                 cert_data: bytes | None = None, key_file: Path | None = None,
                 key_data: bytes | None = None) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(
            cafile=str(ca_file) if ca_file else None,
            cadata=ca_data.decode() if ca_data else None)
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert_file or cert_data:
            _load_client_certificate(context, cert_file, cert_data, key_file, key_data)
    except (OSError, ValueError, ssl.SSLError) as exc:
        raise ClusterApiUnavailable(f"could not load the API credentials: {exc}") from exc
    return context


def _load_client_certificate(context: ssl.SSLContext, cert_file: Path | None,
                             cert_data: bytes | None, key_file: Path | None,
                             key_data: bytes | None) -> None:
    """ssl loads a certificate and key only from files: inline data goes through a private
    directory that is removed before this returns."""
    if cert_file and not (key_file or key_data):
        context.load_cert_chain(str(cert_file))
        return
    with tempfile.TemporaryDirectory(prefix="installer-tls-") as private:
        def path_of(given: Path | None, data: bytes | None, name: str) -> str | None:
            if given:
                return str(given)
            if data is None:
                return None
            target = Path(private) / name
            target.touch(mode=0o600)
            target.write_bytes(data)
            return str(target)

        certificate = path_of(cert_file, cert_data, "client.crt")
        assert certificate is not None
        context.load_cert_chain(certificate, path_of(key_file, key_data, "client.key"))
