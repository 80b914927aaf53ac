"""`installer download` keeps its file out of the page cache as it reaches the disk (nothing
reads a mirror's prefetch soon after); a node's own fetch keeps it cached for the extraction
that follows. Residency is read with util-linux's `fincore`."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lib.httpfaults import FaultServer

from installer.delivery import DownloadSettings, fetch_file

REPO = Path(__file__).resolve().parents[2]
VERSION = "580.105.08"
NAME = f"NVIDIA-Linux-x86_64-{VERSION}.run"
PATH = f"/{VERSION}/{NAME}"
# Above the background sync's stride (32 MiB) twice over, so ranges leave the cache mid-way.
SIZE = (80 << 20) + 12_345


@pytest.fixture(scope="module")
def data() -> bytes:
    return os.urandom(SIZE)


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with FaultServer() as srv:
        yield srv


def resident_bytes(path: Path) -> int:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    if shutil.which("fincore") is None:
        pytest.skip("util-linux's fincore is not installed")
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * 4096)
    with probe.open("rb") as handle:
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if resident_bytes(probe):
        pytest.skip(f"{tmp_path}'s filesystem keeps its pages (tmpfs): no page cache to leave")
    return tmp_path / "mirror"


def download(dest: Path, url: str, pin: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NVIDIA_")}
    return subprocess.run(
        [sys.executable, "-m", "installer", "download", "--version", VERSION, "--dest",
         str(dest)],
        env={**clean, "PYTHONPATH": str(REPO), "NVIDIA_DRIVER_DOWNLOAD_URL": url,
             "NVIDIA_DRIVER_SHA256": pin}, capture_output=True, text=True, timeout=120,
        check=False)


def test_installer_download_leaves_the_page_cache_as_it_writes(
    server: FaultServer, dest: Path, data: bytes
) -> None:
    digest = hashlib.sha256(data).hexdigest()
    # Cut mid-way (after the first background syncs have dropped their ranges): the resumed
    # part is hashed from the disk and the rest appended at the exact byte.
    cut = (40 << 20) + 4321
    server.add(PATH, data, reset_after=cut, stall_after=cut, stall=1.0, stall_times=1)

    result = download(dest, server.url(PATH), digest)

    assert result.returncode == 0, result.stderr
    assert "verified by pin" in result.stderr
    assert [r.header("Range") for r in server.requests_for(PATH)] == [None, f"bytes={cut}-"]
    assert resident_bytes(dest / NAME) <= 1 << 20  # before anything here reads it
    assert hashlib.sha256((dest / NAME).read_bytes()).hexdigest() == digest


def test_a_nodes_fetch_keeps_the_file_cached_for_its_extraction(
    server: FaultServer, dest: Path, data: bytes
) -> None:
    server.add(PATH, data)
    settings = DownloadSettings(retries=1, backoff_initial=0.01, progress="none")

    got = fetch_file([server.url(PATH)], dest, NAME, sha256=hashlib.sha256(data).hexdigest(),
                     settings=settings)

    assert resident_bytes(got.path) > SIZE // 2
