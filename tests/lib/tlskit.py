"""A throwaway CA and a server certificate for 127.0.0.1: HTTPS test servers whose certificate
a client verifies (REQUESTS_CA_BUNDLE or dnf's sslcacert= names the CA), as NVIDIA's download
hosts are verified."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from lib.httpfaults import static_server


class Tls(NamedTuple):
    ca_file: Path  # PEM: what a client trusts
    context: ssl.SSLContext  # the server side, for 127.0.0.1


def make_tls(directory: Path) -> Tls:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def issue(subject: str, key: ec.EllipticCurvePrivateKey,
              issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None
              ) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (x509.CertificateBuilder().subject_name(name)
                   .issuer_name(issuer[0].subject if issuer else name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None),
                                  critical=True))
        if issuer is None:
            builder = builder.add_extension(
                x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                              content_commitment=False, key_encipherment=False,
                              data_encipherment=False, key_agreement=False,
                              encipher_only=False, decipher_only=False), critical=True)
            builder = builder.add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        else:
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()),
                critical=False).add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        return builder.sign(issuer[1] if issuer else key, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    ca = issue("test download CA", ca_key, None)
    server = issue("127.0.0.1", server_key, (ca, ca_key))
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (directory / "server.key").write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "server.pem", directory / "server.key")
    return Tls(ca_file, context)


class Served(NamedTuple):
    base: str  # https://127.0.0.1:<port>
    ca: Path  # the CA that issued the server's certificate, to trust
    requests: list[str]  # request paths, in order


@contextlib.contextmanager
def serve_directory_tls(directory: Path, certs: Path) -> Iterator[Served]:
    """`directory` over HTTPS on 127.0.0.1, its certificate issued by a CA made under `certs`
    (clients trust it through REQUESTS_CA_BUNDLE, dnf through a repo's sslcacert=)."""
    tls = make_tls(certs)
    with static_server(directory, tls.context) as (port, requests):
        yield Served(f"https://127.0.0.1:{port}", tls.ca_file, requests)
