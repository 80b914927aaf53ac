"""A static HTTPS server on 127.0.0.1 with its own self-signed certificate (made with the openssl
command line), for clients that must refuse plain http: the installer trusts it through
REQUESTS_CA_BUNDLE, dnf through a repo's sslcacert=."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from lib.httpfaults import static_server


class Served(NamedTuple):
    base: str  # https://127.0.0.1:<port>
    ca: Path  # the certificate, to trust
    requests: list[str]  # request paths, in order


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for IP 127.0.0.1 and its key."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "cert.pem", directory / "key.pem"
    if not cert.is_file():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True)
    return cert, key


@contextlib.contextmanager
def serve_directory_tls(directory: Path, certs: Path) -> Iterator[Served]:
    """`directory` over HTTPS on 127.0.0.1 with a certificate made under `certs`."""
    cert, key = make_certificate(certs)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with static_server(directory, context) as (port, requests):
        yield Served(f"https://127.0.0.1:{port}", cert, requests)
