"""The fake-driver kit: a makeself .run whose payload behaves like NVIDIA's tools (see README)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kit.builder import build_runfile, runfile_name
from kit.digests import write_digests

__all__ = [
    "build_mirror",
    "build_runfile",
    "extract_runfile",
    "install_nvml",
    "make_signing_key",
    "runfile_name",
    "write_digests",
]


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


def extract_runfile(version: str, work: Path) -> Path:
    """The kit's .run of `version` built under `work` and unpacked there like the real one."""
    runfile = build_runfile(version, work)
    target = work / f"NVIDIA-Linux-x86_64-{version}"
    subprocess.run(["sh", str(runfile), "--extract-only", "--target", str(target)],
                   check=True, capture_output=True)
    return target


def install_nvml(extracted: Path, install: Path, version: str) -> Path:
    """nvidia-smi and the kit's NVML and CUDA (with its PTX JIT compiler) of `version` from an
    unpacked .run in <install>/bin and lib64, with the soname links `ldconfig -n` makes."""
    (install / "bin").mkdir(parents=True)
    (install / "lib64").mkdir()
    shutil.copy2(extracted / "nvidia-smi", install / "bin" / "nvidia-smi")
    for stem in ("libnvidia-ml", "libcuda", "libnvidia-ptxjitcompiler"):
        library = f"{stem}.so.{version}"
        shutil.copy2(extracted / library, install / "lib64" / library)
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")
    if ldconfig is None:
        raise FileNotFoundError("ldconfig is not installed")
    subprocess.run([ldconfig, "-n", str(install / "lib64")], check=True)
    return install


def build_mirror(www: Path, versions: list[str]) -> Path:
    """A driver mirror at `www`: the kit's .run of each version at <version>/, and the digests
    file that vouches for them (a mirror serves bytes only)."""
    for version in versions:
        build_runfile(version, www / version)
    write_digests(www / "digests", www)
    return www
