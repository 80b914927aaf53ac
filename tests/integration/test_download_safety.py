"""Downloads that must not leave a node worse off: a full disk, cached files' modes (a cache
another user could write to would let them swap what root runs next), an endless body, and a
mirror that vouches for its own .run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from lib.httpfaults import FaultServer
from lib.tlskit import Tls, make_tls

from installer.delivery import DownloadSettings, fetch_file
from installer.errors import DownloadFailed, DownloadTooLarge, UnverifiedDownload

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
from installer.errors import DownloadFailed, DownloadTooLarge
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
    digests = tmp_path / "digests"
    digests.write_text(f"{sha(data)}  {NAME}\n")
    caplog.set_level("INFO", "installer.download")

    got = fetch_file([dead_url(PATH), server.url(PATH)], tmp_path / "dest", NAME,
                     settings=replace(DEFAULT_BACKOFF, digests_file=digests))

    assert got.source == server.url(PATH) and got.verified_by == "digests-file"
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


# ------------------------------------------------------------------ who vouches for a .run

V = "580.105.08"
V_NAME = f"NVIDIA-Linux-x86_64-{V}.run"


def hostile_runfile(marker: Path, version: str = V) -> bytes:
    """A .run whose makeself header names the driver, and whose execution, with any argument
    (`--version-string`, `-x`), leaves `marker`: proof that it ran as root."""
    return (
        "#!/bin/sh\n# This script was generated using Makeself 2.4.5\n"
        f'label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version}"\n'
        f'version="{version}"\n'
        f'touch "{marker}"\necho {version}\nexit 0\n'
    ).encode()


def runfile_host(tmp_path: Path, **settings: str) -> dict[str, str]:
    from lib.hostkit import installer_env, make_debian_host

    root = tmp_path / "host"
    kernel = make_debian_host(root)
    return installer_env(root, kernel, NVIDIA_DRIVER_VERSION=V, **settings)


def downloads(env: dict[str, str]) -> list[str]:
    from lib.hostkit import INSTALL_DIR_HOST

    found = Path(env["ROOT_MOUNT_DIR"]) / INSTALL_DIR_HOST.lstrip("/") / "cache" / "downloads"
    return sorted(p.name for p in found.iterdir()) if found.is_dir() else []


def needs_headers() -> None:
    from lib.hostkit import debian_headers

    if debian_headers() is None:
        pytest.skip("needs linux-headers-amd64")


def test_a_mirrors_own_runfile_and_checksum_are_refused_and_never_run(
    server: FaultServer, tmp_path: Path
) -> None:
    from lib.hostkit import run_installer

    needs_headers()
    marker = tmp_path / "ran-as-root"
    body = hostile_runfile(marker)
    server.add(f"/{V}/{V_NAME}", body)
    server.add_sha256sum(f"/{V}/{V_NAME}", body)  # the mirror vouches for itself
    env = runfile_host(tmp_path, NVIDIA_DRIVER_MIRRORS=server.base_url)

    result = run_installer(env, "run")

    assert result.returncode == 26, result.stderr[-3000:]
    assert "error[download-unverified]" in result.stderr
    assert "NVIDIA_DRIVER_SHA256" in result.stderr and "NVIDIA_DRIVER_DIGESTS_FILE" in result.stderr
    assert not marker.exists()
    assert server.count(f"/{V}/{V_NAME}") == 0  # refused before a byte of it was fetched
    assert server.count(f"/{V}/{V_NAME}.sha256sum") == 0  # a mirror's checksum is not asked
    assert not [n for n in downloads(env) if n.startswith(V_NAME)]


def test_a_runfile_is_identified_by_its_header_before_any_of_it_runs(
    server: FaultServer, tmp_path: Path
) -> None:
    from lib.hostkit import run_installer

    needs_headers()
    marker = tmp_path / "ran-as-root"
    other = hostile_runfile(marker, "580.126.20")  # vouched for, but another version
    server.add(f"/{V}/{V_NAME}", other)
    env = runfile_host(tmp_path, NVIDIA_DRIVER_DOWNLOAD_URL=server.url(f"/{V}/{V_NAME}"),
                       NVIDIA_DRIVER_SHA256=sha(other))

    result = run_installer(env, "run")

    assert result.returncode == 25, result.stderr[-3000:]
    assert "error[runfile-mismatch]" in result.stderr
    assert "its label names version 580.126.20" in result.stderr
    assert not marker.exists()
    assert not [n for n in downloads(env) if n.startswith(V_NAME)]


def test_a_cached_runfile_a_mirror_vouched_for_is_not_reused(tmp_path: Path) -> None:
    """A cache record an older installer wrote on a mirror's word: fetched again, or refused."""
    body = hostile_runfile(tmp_path / "marker")
    (tmp_path / V_NAME).write_bytes(body)
    (tmp_path / f"{V_NAME}.download.json").write_text(json.dumps({
        "filename": V_NAME, "size": len(body), "sha256": sha(body),
        "source": "http://mirror.local", "verified_by": "published-sha256sum"}))
    with FaultServer() as srv:
        srv.add(f"/{V_NAME}", body)
        with pytest.raises(DownloadFailed) as info:
            fetch_file([srv.url(f"/{V_NAME}")], tmp_path, V_NAME, settings=FAST)
        assert info.value.reference == "download-unverified"
        assert srv.count(f"/{V_NAME}") == 0


def test_a_runfile_prefetched_on_the_operators_word_is_reused_without_it(tmp_path: Path) -> None:
    """`installer download --dest <cache>` with a pin or digests file, then a node's run
    without them: what this installer verified is reused, offline."""
    body = os.urandom(1000)
    with FaultServer() as srv:
        srv.add(f"/{V_NAME}", body)
        fetch_file([srv.url(f"/{V_NAME}")], tmp_path, V_NAME, sha256=sha(body), settings=FAST)
    again = fetch_file(["http://127.0.0.1:9/x.run"], tmp_path, V_NAME, settings=FAST)
    assert (again.from_cache, again.verified_by) == (True, "pin")


# ------------------------------------------------------------------ an endless body

def endless_server(announce: int | None = None) -> tuple[str, Callable[[], int]]:
    """A raw HTTP server on 127.0.0.1 that sends zeros until the client hangs up (stopping at
    1 GiB so a broken client cannot hang the test); returns its URL and the bytes sent."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    sent = [0]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                length = f"Content-Length: {announce}\r\n" if announce is not None else ""
                conn.sendall(f"HTTP/1.1 200 OK\r\n{length}Connection: close\r\n\r\n".encode())
                chunk = b"\0" * (1 << 20)
                try:
                    while sent[0] < (1 << 30):
                        conn.sendall(chunk)
                        sent[0] += len(chunk)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/{V_NAME}"
    return url, lambda: sent[0]


def test_an_endless_body_stops_at_the_cap_and_leaves_nothing(tmp_path: Path) -> None:
    url, sent = endless_server()
    capped = replace(FAST, max_bytes=8 << 20, retries=0)

    with pytest.raises(DownloadTooLarge) as info:
        fetch_file([url], tmp_path, V_NAME, sha256="a" * 64, settings=capped)

    assert info.value.exit_code == 27 and "past 8388608 bytes" in info.value.message
    assert list(tmp_path.iterdir()) == []  # the partial file was removed
    assert sent() < 64 << 20


def test_the_digests_files_size_caps_the_body(tmp_path: Path) -> None:
    url, _ = endless_server()
    digests = tmp_path / "digests"
    digests.write_text(f"{'a' * 64}  {V_NAME}  1000000\n")
    dest = tmp_path / "dest"
    settings = replace(FAST, digests_file=digests, retries=0)

    with pytest.raises(DownloadTooLarge) as info:
        fetch_file([url], dest, V_NAME, settings=settings)

    assert "past 1000000 bytes" in info.value.message and "listed size" in info.value.message
    assert list(dest.iterdir()) == []


def test_a_body_announced_larger_than_the_cap_is_refused_unread(tmp_path: Path) -> None:
    url, _ = endless_server(announce=5 << 30)

    with pytest.raises(DownloadTooLarge) as info:
        fetch_file([url], tmp_path, V_NAME, sha256="a" * 64, settings=replace(FAST, retries=0))

    assert f"announces {5 << 30} bytes" in info.value.message
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------- a trusted origin's redirect to another host


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def two_origins(tls: Tls, monkeypatch: pytest.MonkeyPatch
                ) -> Iterator[tuple[FaultServer, FaultServer]]:
    """Two HTTPS servers the client verifies (a test CA): the first is the trusted origin, the
    second a host on the same CA (any public https host) that nobody named."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))
    with FaultServer(tls=tls.context) as trusted, FaultServer(tls=tls.context) as other:
        yield trusted, other


def test_a_trusted_origins_checksum_redirected_to_another_https_host_vouches_for_nothing(
    two_origins: tuple[FaultServer, FaultServer], tmp_path: Path
) -> None:
    """An open redirect on the trusted origin hands the digest to another host: that host's
    checksum for its own bytes must not count as the origin's word."""
    trusted, other = two_origins
    evil = b"#!/bin/sh\necho owned\n" * 1000
    other.add(PATH, evil)
    other.add_sha256sum(PATH, evil)
    trusted.add(PATH + ".sha256sum", status=302,
                headers={"Location": other.url(PATH + ".sha256sum")})
    settings = replace(FAST, trusted_origins=(trusted.base_url,))

    with pytest.raises(UnverifiedDownload):
        fetch_file([other.url(PATH)], tmp_path, NAME,
                   checksum_urls=[trusted.url(PATH + ".sha256sum")], settings=settings)

    assert other.count(PATH + ".sha256sum") == 1  # followed, and then not believed
    assert other.count(PATH) == 0 and sorted(os.listdir(tmp_path)) == []


def test_a_redirect_within_the_trusted_origin_still_vouches(
    two_origins: tuple[FaultServer, FaultServer], tmp_path: Path
) -> None:
    trusted, other = two_origins
    data = os.urandom(4096)
    other.add(PATH, data)
    trusted.add("/current.sha256sum", status=302,
                headers={"Location": trusted.url(PATH + ".sha256sum")})
    trusted.add_sha256sum(PATH, data)
    settings = replace(FAST, trusted_origins=(trusted.base_url,))

    got = fetch_file([other.url(PATH)], tmp_path, NAME,
                     checksum_urls=[trusted.url("/current.sha256sum")], settings=settings)

    assert (got.sha256, got.verified_by) == (sha(data), "trusted-origin")


def fm_listing(version: str, archive: bytes) -> bytes:
    from installer.components import fm_archive

    name = fm_archive.archive_name(version, "x86_64")
    return json.dumps({"fabricmanager": {"version": version, "linux-x86_64": {
        "relative_path": f"fabricmanager/linux-x86_64/{name}",
        "sha256": sha(archive), "size": str(len(archive))}}}).encode()


def test_a_redistrib_json_redirected_off_the_trusted_origin_vouches_for_nothing(
    two_origins: tuple[FaultServer, FaultServer], tmp_path: Path
) -> None:
    """Fabric Manager's (and NVLSM's, IMEX's) archive digest comes from the redistrib JSON:
    the same rule, every hop a trusted origin, or the archive is refused unfetched."""
    from installer.components import fm_archive
    from installer.config import from_env
    from installer.hostroot import HostRoot
    from installer.layout import Layout

    trusted, other = two_origins
    version = "580.95.05"
    evil = b"not nvidia's archive"
    other.add(f"/redist/redistrib_{version}.json", fm_listing(version, evil))
    other.add(f"/redist/fabricmanager/linux-x86_64/{fm_archive.archive_name(version, 'x86_64')}",
              evil)
    trusted.add(f"/redist/redistrib_{version}.json", status=301,
                headers={"Location": other.url(f"/redist/redistrib_{version}.json")})
    config = from_env({"NVIDIA_FABRICMANAGER_REDIST": trusted.url("/redist"),
                       "NVIDIA_DRIVER_TRUSTED_ORIGINS": trusted.base_url,
                       "NVIDIA_INSTALLER_RETRIES": "1"})
    layout = Layout.from_config(config, HostRoot(tmp_path))

    with pytest.raises(UnverifiedDownload):
        fm_archive.fetch(config, layout, version, "x86_64")

    listed, _ = fm_archive.locate(config, version, "x86_64")
    assert listed.trusted is False
    assert other.count(f"/redist/fabricmanager/linux-x86_64/"
                       f"{fm_archive.archive_name(version, 'x86_64')}") == 0


def test_a_redistrib_json_on_the_trusted_origin_vouches(
    two_origins: tuple[FaultServer, FaultServer]
) -> None:
    from installer.components import fm_archive
    from installer.config import from_env

    trusted, _ = two_origins
    version = "580.95.05"
    trusted.add(f"/redist/redistrib_{version}.json", fm_listing(version, b"archive"))
    config = from_env({"NVIDIA_FABRICMANAGER_REDIST": trusted.url("/redist"),
                       "NVIDIA_DRIVER_TRUSTED_ORIGINS": trusted.base_url})

    listed, _ = fm_archive.locate(config, version, "x86_64")

    assert listed.trusted is True and listed.sha256 == sha(b"archive")
