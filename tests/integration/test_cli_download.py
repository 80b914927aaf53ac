"""`installer download`: prefetch a version's .run for air-gapped nodes or a mirror."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import kit
from lib.httpfaults import FaultServer

REPO = Path(__file__).resolve().parents[2]
VERSION = "580.105.08"
NAME = f"NVIDIA-Linux-x86_64-{VERSION}.run"


def download(dest: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NVIDIA_")}
    return subprocess.run(
        [sys.executable, "-m", "installer", "download", "--dest", str(dest), *args],
        env={**clean, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True,
        timeout=120, check=False)


def test_branch_is_resolved_fetched_verified_and_then_served_from_the_cache(
        tmp_path: Path) -> None:
    """The operator's own copy (pinned) is fetched, and DEST/digests written for the nodes."""
    runfile = kit.build_runfile(VERSION, tmp_path / "src")
    data = runfile.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    dest = tmp_path / "mirror" / VERSION
    with FaultServer() as server:
        server.add(f"/{VERSION}/{NAME}", data, fail_times=1)
        mirror = server.url("/").rstrip("/")
        # R580's newest in the shipped catalog is not VERSION, so pin it exactly.
        first = download(dest, "--version", VERSION, "--sha256", digest,
                         NVIDIA_DRIVER_MIRRORS=mirror)
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip() == str(dest / NAME)
        assert server.count(f"/{VERSION}/{NAME}") == 2  # a 503, then the file
    assert hashlib.sha256((dest / NAME).read_bytes()).hexdigest() == digest
    assert "verified by pin" in first.stderr
    assert (dest / "digests").read_text() == f"{digest}  {NAME}  {len(data)}\n"
    # The nodes' side: a mirror of DEST, vouched for by the digests file alone.
    again = download(tmp_path / "node", "--version", VERSION,
                     NVIDIA_DRIVER_DOWNLOAD_URL=f"file://{dest / NAME}",
                     NVIDIA_DRIVER_DIGESTS_FILE=str(dest / "digests"))
    assert again.returncode == 0, again.stderr
    assert "verified by digests-file" in again.stderr


def test_a_mirror_serving_its_own_checksum_is_refused_and_nothing_written(
        tmp_path: Path) -> None:
    runfile = kit.build_runfile(VERSION, tmp_path / "src")
    dest = tmp_path / "mirror"
    with FaultServer() as server:
        server.add(f"/{VERSION}/{NAME}", runfile.read_bytes())
        server.add_sha256sum(f"/{VERSION}/{NAME}", runfile.read_bytes())
        result = download(dest, "--version", VERSION,
                          NVIDIA_DRIVER_DOWNLOAD_URL=server.url(f"/{VERSION}/{NAME}"))
        assert server.count(f"/{VERSION}/{NAME}") == 0
    assert result.returncode == 26, result.stderr
    assert "error[download-unverified]" in result.stderr
    assert not dest.exists() or list(dest.iterdir()) == []


def test_bytes_nothing_vouched_for_never_become_the_nodes_digests(tmp_path: Path) -> None:
    """NVIDIA publishes no checksum for its tesla/ and aarch64 files, so an operator may
    prefetch with NVIDIA_DRIVER_ALLOW_UNVERIFIED=true: whatever the first mirror served must not
    then reach the nodes as the operator's digests file."""
    runfile = kit.build_runfile(VERSION, tmp_path / "src")
    dest = tmp_path / "mirror"
    with FaultServer() as server:
        server.add(f"/{VERSION}/{NAME}", runfile.read_bytes())
        result = download(dest, "--version", VERSION,
                          NVIDIA_DRIVER_DOWNLOAD_URL=server.url(f"/{VERSION}/{NAME}"),
                          NVIDIA_DRIVER_ALLOW_UNVERIFIED="true")
    assert result.returncode == 0, result.stderr
    assert (dest / NAME).is_file()
    assert not (dest / "digests").exists()
    assert "not added to" in result.stderr and "NVIDIA_DRIVER_SHA256" in result.stderr


def test_the_digests_file_keeps_the_entries_of_other_files(tmp_path: Path) -> None:
    runfile = kit.build_runfile(VERSION, tmp_path / "src")
    dest = tmp_path / "dest"
    dest.mkdir()
    other = f"{'c' * 64}  fabricmanager-linux-x86_64-{VERSION}-archive.tar.xz  42\n"
    (dest / "digests").write_text(other)
    result = download(dest, "--version", VERSION, NVIDIA_DRIVER_DOWNLOAD_URL=f"file://{runfile}")
    assert result.returncode == 0, result.stderr
    digest = hashlib.sha256(runfile.read_bytes()).hexdigest()
    size = runfile.stat().st_size
    assert (dest / "digests").read_text() == f"{digest}  {NAME}  {size}\n" + other


def test_a_wrong_pin_deletes_the_file_and_exits_with_its_code(tmp_path: Path) -> None:
    runfile = kit.build_runfile(VERSION, tmp_path / "src")
    dest = tmp_path / "dest"
    result = download(dest, "--version", VERSION, "--sha256", "0" * 64,
                      NVIDIA_DRIVER_DOWNLOAD_URL=f"file://{runfile}")
    assert result.returncode == 23, result.stderr
    assert "error[checksum-mismatch]" in result.stderr
    assert not (dest / NAME).exists()
