"""Downloads that must not leave a node worse off: a full disk, cached files' modes (a cache
another user could write to would let them swap what root runs next)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lib.httpfaults import FaultServer

from installer.delivery import DownloadSettings, fetch_file
from installer.errors import DownloadFailed

REPO = Path(__file__).resolve().parents[2]
NAME = "NVIDIA-Linux-x86_64-580.95.05.run"
PATH = f"/tesla/580.95.05/{NAME}"
FAST = DownloadSettings(retries=1, connect_timeout=2, read_timeout=2, backoff_initial=0.01,
                        progress="none")


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with FaultServer() as srv:
        yield srv


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


CHILD = """
import json, sys
from pathlib import Path
from installer.delivery import DownloadSettings, fetch_file
from installer.errors import DownloadFailed
from installer.errors import InstallerError
dest = Path(sys.argv[2])
try:
    fetch_file([sys.argv[1]], dest, sys.argv[3], sha256=sys.argv[4],
               settings=DownloadSettings(retries=1, backoff_initial=0.01, progress="none"))
    outcome = "fetched"
except InstallerError as exc:
    outcome = exc.reference
print(json.dumps({"outcome": outcome, "left": sorted(p.name for p in dest.iterdir())}))
"""


def test_disk_full_without_content_length_leaves_no_part(
    server: FaultServer, tmp_path: Path
) -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("needs root and unshare to mount a small tmpfs")
        pytest.skip("needs root and unshare to mount a small tmpfs")
    data = os.urandom(6 << 20)
    server.add(PATH, data, no_length=True)
    dest = tmp_path / "small"
    dest.mkdir()
    # A real 2 MiB filesystem in a private mount namespace: the write fails with ENOSPC from
    # the kernel, after the check for free space could not know the size.
    script = 'mount -t tmpfs -o size=2m none "$1" && shift && exec "$@"'
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(dest),
         sys.executable, "-c", CHILD, server.url(PATH), str(dest), NAME, sha(data)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"outcome": "insufficient-space", "left": []}


def test_downloaded_and_resumed_files_are_private(server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    server.add(PATH, data, reset_after=100_000)
    os.umask(0o022)
    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)
    assert stat.S_IMODE(got.path.stat().st_mode) == 0o600
    assert not list(tmp_path.glob("*.part"))


def test_a_world_readable_cached_file_is_made_private_when_reused(
    server: FaultServer, tmp_path: Path
) -> None:
    data = b"#!/bin/sh\necho fake runfile\n"
    server.add(PATH, data)
    first = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)
    first.path.chmod(0o644)  # as an older installer left it

    again = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert again.from_cache and server.count(PATH) == 1
    assert stat.S_IMODE(again.path.stat().st_mode) == 0o600


# A cut after 1 byte: that byte arrives with the headers, in http.client's read-ahead buffer,
# which its readinto1 loses when the socket read in the same call fails.
@pytest.mark.parametrize("cut", [1, 100_000, (1 << 20) + 12_345, 3 << 20])
def test_a_reset_resumes_at_the_exact_byte_received(
    server: FaultServer, tmp_path: Path, cut: int
) -> None:
    data = os.urandom(4 << 20)
    # The pause lets the client read what was sent before the reset: a TCP reset makes the
    # kernel drop bytes the process has not read yet, which no client can keep.
    server.add(PATH, data, reset_after=cut, stall_after=cut, stall=1.0, stall_times=1)

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.path.read_bytes() == data
    ranges = [r.header("Range") for r in server.requests_for(PATH)]
    assert ranges == [None, f"bytes={cut}-"]  # nothing received is fetched twice
    assert got.bytes_transferred == len(data)


DEFAULT_BACKOFF = DownloadSettings(progress="none")  # 5 retries, 1 s initial backoff


def dead_url(path: str) -> str:
    dead = FaultServer()
    url = dead.url(path)
    dead.stop()  # the port is closed now: connection refused
    return url


def test_a_refusing_mirror_is_left_at_once_for_the_next(
    server: FaultServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = os.urandom(1000)
    server.add(PATH, data)
    server.add(PATH + ".sha256sum", f"{sha(data)}  {NAME}\n".encode())
    caplog.set_level("INFO", "installer.download")

    got = fetch_file([dead_url(PATH), server.url(PATH)], tmp_path, NAME,
                     settings=DEFAULT_BACKOFF)

    assert got.source == server.url(PATH) and got.verified_by == "published-sha256sum"
    assert "retrying in" not in caplog.text  # no backoff was spent on the dead mirror
    assert caplog.text.count("trying the next source") == 1


def test_a_mirror_that_does_not_resolve_is_left_at_once(
    server: FaultServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    real = socket.getaddrinfo

    def resolver(host: object, *args: object, **kwargs: object) -> object:
        # What the resolver answers for a name that does not exist (no DNS in tests).
        if host == "mirror.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    data = os.urandom(1000)
    server.add(PATH, data)
    caplog.set_level("INFO", "installer.download")

    got = fetch_file([f"http://mirror.invalid{PATH}", server.url(PATH)], tmp_path, NAME,
                     sha256=sha(data), settings=DEFAULT_BACKOFF)

    assert got.source == server.url(PATH)
    assert "retrying in" not in caplog.text


def test_when_no_mirror_answers_the_list_is_retried_as_a_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    urls = [dead_url("/a" + PATH), dead_url("/b" + PATH)]
    caplog.set_level("INFO", "installer.download")

    with pytest.raises(DownloadFailed) as info:
        fetch_file(urls, tmp_path, NAME, sha256="a" * 64, settings=FAST)

    assert "all 2 sources failed" in info.value.message
    assert info.value.message.count("unreachable in 2 of 2 rounds") == 2
    assert "2 of 2 sources unreachable; trying them again" in caplog.text
    assert caplog.text.count("trying the next source") == 4  # 2 sources x 2 rounds
