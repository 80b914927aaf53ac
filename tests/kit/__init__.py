"""The fake-driver kit: a makeself .run whose payload behaves like NVIDIA's tools (see README)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kit.builder import build_runfile, runfile_name
from kit.digests import write_digests

__all__ = ["build_runfile", "make_signing_key", "runfile_name", "write_digests"]


def make_signing_key(directory: Path) -> tuple[Path, Path]:
    """A throwaway module-signing key pair (private key, DER certificate) made with openssl."""
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / "signing.key", directory / "signing.der"
    subprocess.run(
        ["openssl", "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=installer test signing key/", "-outform", "DER",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return key, cert
