"""The trust-root parser: every key file an operator (or a mistake) can hand it ends in the keys
it accepts or in error[trust-root-invalid] naming the block and the accepted algorithms, read
in one linear pass over a file of bounded size."""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, x25519

from installer.delivery import trust
from installer.errors import TrustRootInvalid


def _pem(key: Any) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def _block(kind: str, der: bytes) -> bytes:
    body = base64.encodebytes(der)
    return f"-----BEGIN {kind}-----\n".encode() + body + f"-----END {kind}-----\n".encode()


def _load(tmp_path: Path, data: bytes) -> trust.TrustRoot:
    path = tmp_path / "trusted.pub"
    path.write_bytes(data)
    return trust.load_trust_root(path)


def test_keys_of_the_accepted_algorithms_load_in_order(tmp_path: Path) -> None:
    p256 = ec.generate_private_key(ec.SECP256R1())
    edkey = ed25519.Ed25519PrivateKey.generate()
    text = b"comment before\r\n" + _pem(p256).replace(b"\n", b"\r\n") + b"between\n" + _pem(edkey)
    root = _load(tmp_path, text)
    assert [trust.fingerprint(k) for k in root.keys] == [
        trust.fingerprint(p256.public_key()), trust.fingerprint(edkey.public_key())]


@pytest.mark.parametrize("make", [
    lambda: ed448.Ed448PrivateKey.generate(),
    lambda: dsa.generate_private_key(1024),
    lambda: x25519.X25519PrivateKey.generate(),
], ids=["ed448", "dsa", "x25519"])
def test_a_key_of_another_algorithm_names_the_block_and_what_is_accepted(
        tmp_path: Path, make: Any) -> None:
    good = _pem(ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(TrustRootInvalid) as info:
        _load(tmp_path, good + _pem(make()))
    message = info.value.message
    assert "block 2 (PUBLIC KEY, line 5)" in message
    assert "ECDSA P-256/P-384, RSA or Ed25519" in message
    assert info.value.exit_code == 87


def test_a_key_of_an_algorithm_nobody_knows_is_a_clear_error(tmp_path: Path) -> None:
    # SubjectPublicKeyInfo { AlgorithmIdentifier { 1.2.3.4 }, BIT STRING 01 02 }: the library
    # raises UnsupportedAlgorithm, which used to escape as a traceback.
    der = bytes.fromhex("300c" "3005" "06032a0304" "0303000102")
    with pytest.raises(TrustRootInvalid, match=r"block 1 \(PUBLIC KEY, line 1\)") as info:
        _load(tmp_path, _block("PUBLIC KEY", der))
    assert "Unknown key type" in info.value.message
    assert "ECDSA P-256/P-384, RSA or Ed25519" in info.value.message


def test_blocks_that_are_no_public_key_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(TrustRootInvalid, match=r"block 1 \(PRIVATE KEY, line 1\) is no public key"):
        _load(tmp_path, _block("PRIVATE KEY", b"\x30\x00"))
    with pytest.raises(TrustRootInvalid, match="unreadable PUBLIC KEY"):
        _load(tmp_path, _block("PUBLIC KEY", b"\x30\x03garbage"))
    with pytest.raises(TrustRootInvalid, match="no END line"):
        _load(tmp_path, b"-----BEGIN PUBLIC KEY-----\nMFkw\n")
    with pytest.raises(TrustRootInvalid, match="no PEM public key or certificate"):
        _load(tmp_path, b"nothing here\n")


def test_a_mebibyte_of_unterminated_begin_lines_is_refused_at_once(tmp_path: Path) -> None:
    """A backtracking regex took minutes on this; a line scanner answers in milliseconds."""
    line = b"-----BEGIN PUBLIC KEY-----\n"
    outcome: list[BaseException] = []

    def load(data: bytes) -> None:
        try:
            _load(tmp_path, data)
        except BaseException as exc:  # what the parser answered, whatever it is
            outcome.append(exc)

    for data in (line * ((1 << 20) // len(line)), line * ((1 << 20) // len(line) + 1)):
        outcome.clear()
        worker = threading.Thread(target=load, args=(data,), daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), "the parser is still busy after 10 s"
        assert len(outcome) == 1 and isinstance(outcome[0], TrustRootInvalid), outcome
    assert "larger than 1 MiB" in str(outcome[0])
