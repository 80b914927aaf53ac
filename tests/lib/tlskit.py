"""A throwaway CA and a server certificate for 127.0.0.1: HTTPS test servers whose certificate
a client verifies (REQUESTS_CA_BUNDLE or dnf's sslcacert= names the CA), as NVIDIA's download
hosts are verified; issue_certificate makes the other test PKIs (the stand-in API server's)."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from lib.httpfaults import static_server

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec


class Tls(NamedTuple):
    ca_file: Path  # PEM: what a client trusts
    context: ssl.SSLContext  # the server side, for 127.0.0.1


def new_key() -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def issue_certificate(subject: str, key: ec.EllipticCurvePrivateKey,
                      issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
                      names: list[x509.GeneralName] | None = None) -> x509.Certificate:
    """A certificate for `key`, valid for a day: a CA's own (issuer None) or one `issuer`
    (its certificate and key) signs, for the subject alternative `names`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
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
            critical=False)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def make_tls(directory: Path) -> Tls:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    directory.mkdir(parents=True, exist_ok=True)
    ca_key, server_key = new_key(), new_key()
    ca = issue_certificate("test download CA", ca_key, None)
    server = issue_certificate("127.0.0.1", server_key, (ca, ca_key),
                               [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    write_key(directory / "server.key", server_key)
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


def issue_client_certificate(user: str, groups: list[str], key: ec.EllipticCurvePrivateKey,
                             issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
                             ) -> x509.Certificate:
    """A client certificate as kube-apiserver reads one: the common name is the user, each
    organization a group (system:node:<name> in system:nodes is a kubelet), valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups),
                         x509.NameAttribute(NameOID.COMMON_NAME, user)])
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer[0].subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(issuer[1], hashes.SHA256()))
