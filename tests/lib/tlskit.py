"""A static HTTPS server on 127.0.0.1 with its own self-signed certificate (made with the openssl
command line), for clients that must refuse plain http: the installer trusts it through
REQUESTS_CA_BUNDLE, dnf through a repo's sslcacert=."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple


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
    requests: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(directory), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            requests.append(self.path)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Served(f"https://127.0.0.1:{server.server_address[1]}", cert, requests)
    finally:
        server.shutdown()
        server.server_close()
