"""fetch_file / fetch_bytes against a real HTTP server on 127.0.0.1 that injects faults."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from lib.httpfaults import FaultServer, ForwardProxy
from lib.tlskit import Tls, make_tls

from installer import delivery
from installer.delivery import DownloadSettings, fetch_bytes, fetch_file
from installer.delivery import part as delivery_part
from installer.errors import (
    ChecksumMismatch,
    DownloadFailed,
    DownloadForbidden,
    DownloadNotFound,
    InsufficientSpace,
    UnverifiedDownload,
)

MiB = 1 << 20
FAST = DownloadSettings(
    retries=3,
    connect_timeout=2,
    read_timeout=2,
    backoff_initial=0.01,
    backoff_max=0.05,
    progress="none",
)
NAME = "NVIDIA-Linux-x86_64-580.95.05.run"
PATH = f"/tesla/580.95.05/{NAME}"


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic, incompressible-enough bytes."""
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size] if seed == 0 else os.urandom(size)


# Tests of what happens without any checksum accept unverified files, as the operator's
# NVIDIA_DRIVER_ALLOW_UNVERIFIED=true would.
UNVERIFIED_OK = replace(FAST, allow_unverified=True)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with FaultServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def origin(tls: Tls, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultServer]:
    """An HTTPS server whose certificate the client verifies (a test CA in
    REQUESTS_CA_BUNDLE): a publisher's origin, trusted where `trusting` names it."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))
    with FaultServer(tls=tls.context) as srv:
        yield srv


def trusting(srv: FaultServer, settings: DownloadSettings = FAST) -> DownloadSettings:
    return replace(settings, trusted_origins=(srv.base_url,))


@pytest.fixture
def data() -> bytes:
    return os.urandom(2 * MiB + 12345)


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ----------------------------------------------------------------------------- the happy path


def test_download_verified_by_a_trusted_origins_sha256sum(
    origin: FaultServer, data: bytes, tmp_path: Path
) -> None:
    origin.add(PATH, data)
    origin.add_sha256sum(PATH, data)

    got = fetch_file([origin.url(PATH)], tmp_path, NAME, settings=trusting(origin))

    assert got.path.read_bytes() == data
    expected = (sha(data), "trusted-origin", False)
    assert (got.sha256, got.verified_by, got.from_cache) == expected
    assert got.bytes_transferred == len(data)
    assert got.source == origin.url(PATH)
    assert files_in(tmp_path) == sorted([NAME, NAME + ".download.json"])
    # identity encoding: we hash the bytes as stored on the server
    assert origin.requests_for(PATH)[0].header("Accept-Encoding") == "identity"


def test_a_mirrors_own_sha256sum_vouches_for_nothing(
    server: FaultServer, origin: FaultServer, data: bytes, tmp_path: Path
) -> None:
    """Plain http, and https from an origin nobody named: bytes only, refused unfetched."""
    for srv in (server, origin):
        srv.add(PATH, data)
        srv.add_sha256sum(PATH, data)
        with pytest.raises(UnverifiedDownload) as info:
            fetch_file([srv.url(PATH)], tmp_path, NAME, settings=FAST)
        assert "NVIDIA_DRIVER_DIGESTS_FILE" in info.value.hint
        assert srv.count(PATH) == 0 and srv.count(PATH + ".sha256sum") == 0
    assert files_in(tmp_path) == []


def test_a_trusted_origins_checksum_redirected_to_plain_http_is_refused(
    server: FaultServer, origin: FaultServer, data: bytes, tmp_path: Path
) -> None:
    origin.add(PATH, data)
    origin.add(PATH + ".sha256sum", status=302,
               headers={"Location": server.url(PATH + ".sha256sum")})
    server.add_sha256sum(PATH, data)

    with pytest.raises(DownloadFailed, match="not https"):
        fetch_file([origin.url(PATH)], tmp_path, NAME, settings=trusting(origin))

    assert origin.count(PATH) == 0 and files_in(tmp_path) == []


def test_the_digests_file_vouches_for_a_mirrors_bytes(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data)
    digests = tmp_path / "digests"
    digests.write_text(f"{sha(data)}  {NAME}  {len(data)}\n")
    dest = tmp_path / "dest"

    got = fetch_file([server.url(PATH)], dest, NAME, settings=replace(FAST, digests_file=digests))

    assert (got.verified_by, got.path.read_bytes()) == ("digests-file", data)
    assert server.count(PATH + ".sha256sum") == 0
    again = fetch_file([server.url(PATH)], dest, NAME,
                       settings=replace(FAST, digests_file=digests))
    assert again.from_cache and server.count(PATH) == 1


def test_no_published_checksum_downloads_unverified_with_warning(
    server: FaultServer, data: bytes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.add(PATH, data)  # no .sha256sum: the server answers 404 for it
    caplog.set_level(logging.INFO, "installer.download")

    got = fetch_file([server.url(PATH)], tmp_path, NAME, settings=UNVERIFIED_OK)

    assert got.verified_by == "none"
    assert got.path.read_bytes() == data
    assert any(
        r.levelno == logging.WARNING and "UNVERIFIED" in r.getMessage()
        for r in caplog.records
    )


def test_no_checksum_from_any_source_is_refused_before_the_download(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data)  # no pin, and the .sha256sum answers 404

    with pytest.raises(UnverifiedDownload) as info:
        fetch_file([server.url(PATH), server.url("/other" + PATH)], tmp_path, NAME, settings=FAST)

    assert info.value.exit_code == 26 and info.value.reference == "download-unverified"
    assert "NVIDIA_DRIVER_ALLOW_UNVERIFIED" in info.value.hint
    assert server.count(PATH) == 0  # not one byte of the unvouched file was fetched
    assert list(tmp_path.iterdir()) == []


def test_s3_style_403_on_checksum_file_means_none_published(
    origin: FaultServer, data: bytes, tmp_path: Path
) -> None:
    origin.add(PATH, data)
    origin.add(PATH + ".sha256sum", status=403)

    got = fetch_file([origin.url(PATH)], tmp_path, NAME,
                     settings=trusting(origin, UNVERIFIED_OK))

    assert got.verified_by == "none"
    assert origin.count(PATH + ".sha256sum") == 1


def test_checksum_urls_replace_the_per_mirror_checksum(
    origin: FaultServer, server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data)  # a mirror's bytes, vouched for by the origin's SHA256SUMS
    origin.add("/sums/SHA256SUMS", f"{'0' * 64}  other.run\n{sha(data)}  {NAME}\n".encode())

    got = fetch_file(
        [server.url(PATH)],
        tmp_path,
        NAME,
        checksum_urls=[origin.url("/sums/SHA256SUMS")],
        settings=trusting(origin),
    )

    assert got.verified_by == "trusted-origin"
    assert server.count(PATH + ".sha256sum") == 0


# ----------------------------------------------------------------------------- retries


def test_503_twice_then_200_is_retried(server: FaultServer, data: bytes, tmp_path: Path) -> None:
    server.add(PATH, data, fail_times=2, fail_status=503)

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.path.read_bytes() == data
    assert [r.status for r in server.requests_for(PATH)] == [503, 503, 200]


def test_429_retry_after_is_honoured_instead_of_backoff(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data, fail_times=1, fail_status=429, retry_after="0")
    slow_backoff = DownloadSettings(
        retries=2, backoff_initial=20, backoff_max=20, read_timeout=2, progress="none"
    )

    started = time.monotonic()
    fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=slow_backoff)

    assert time.monotonic() - started < 5  # the 20 s backoff was not used
    assert server.count(PATH) == 2


def test_5xx_forever_gives_up_after_retries(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data, fail_times=100, fail_status=500)

    with pytest.raises(DownloadFailed) as info:
        fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert type(info.value) is DownloadFailed
    assert server.count(PATH) == FAST.retries + 1
    assert "HTTP 500" in info.value.message and "gave up after 4 attempts" in info.value.message
    assert files_in(tmp_path) == []


def test_404_is_not_retried(server: FaultServer, tmp_path: Path) -> None:
    server.add(PATH, status=404)

    with pytest.raises(DownloadNotFound) as info:
        fetch_file([server.url(PATH)], tmp_path, NAME, sha256="a" * 64, settings=FAST)

    assert server.count(PATH) == 1
    assert info.value.exit_code == 21 and "404" in info.value.message


def test_403_is_not_retried_and_no_credentials_were_sent(
    server: FaultServer, tmp_path: Path
) -> None:
    server.add(PATH, status=403)

    with pytest.raises(DownloadForbidden) as info:
        fetch_file([server.url(PATH)], tmp_path, NAME, sha256="a" * 64, settings=FAST)

    assert server.count(PATH) == 1
    assert server.requests_for(PATH)[0].header("Authorization") is None
    assert "No credentials were sent" in info.value.hint


def test_netrc_is_never_used(
    server: FaultServer, data: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password hunter2\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    server.add(PATH, data)

    fetch_file([server.url(PATH)], tmp_path / "d", NAME, sha256=sha(data), settings=FAST)

    assert server.requests_for(PATH)[0].header("Authorization") is None


def test_credentials_in_url_are_sent_and_redacted_everywhere(
    server: FaultServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.add(PATH, fail_times=100, fail_status=503)
    caplog.set_level(logging.DEBUG)
    url = server.url(PATH, userinfo="robot:s3cr3t-pa55")

    with pytest.raises(DownloadFailed) as info:
        fetch_file([url], tmp_path, NAME, settings=UNVERIFIED_OK)

    sent = server.requests_for(PATH)[0].header("Authorization")
    assert sent is not None and sent.startswith("Basic ")
    text = str(info.value) + info.value.hint + caplog.text
    assert "s3cr3t" not in text and "robot" not in text
    assert "http://***@127.0.0.1" in info.value.message
    assert "http://***@127.0.0.1" in caplog.text


def test_401_with_credentials_says_they_were_refused(server: FaultServer, tmp_path: Path) -> None:
    server.add(PATH, status=401)

    with pytest.raises(DownloadForbidden) as info:
        fetch_file(
            [server.url(PATH, userinfo="u:pw")], tmp_path, NAME, sha256="a" * 64, settings=FAST
        )

    assert "credentials in the URL were sent" in info.value.hint
    assert "u:pw" not in info.value.message


def test_stalled_server_times_out_and_gives_up(server: FaultServer, tmp_path: Path) -> None:
    server.add(PATH, b"x" * 1000, stall=3.0)  # silent before the headers, every time
    settings = DownloadSettings(
        retries=2, read_timeout=0.2, backoff_initial=0.01, backoff_max=0.02, progress="none"
    )

    started = time.monotonic()
    with pytest.raises(DownloadFailed) as info:
        fetch_file([server.url(PATH)], tmp_path, NAME, sha256="a" * 64, settings=settings)

    assert time.monotonic() - started < 2.0
    assert server.count(PATH) == 3
    assert "no response within 0.2 s" in info.value.message
    assert "gave up after 3 attempts" in info.value.message


def test_stall_mid_body_times_out_then_resumes(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data, stall=3.0, stall_after=MiB, stall_times=1)
    settings = DownloadSettings(
        retries=2, read_timeout=0.3, backoff_initial=0.01, backoff_max=0.02, progress="none"
    )

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=settings)

    assert got.path.read_bytes() == data
    ranged = server.range_requests(PATH)
    assert len(ranged) == 1
    assert int(re.findall(r"\d+", ranged[0].header("Range") or "")[0]) >= MiB // 2


# ----------------------------------------------------------------------------- resume


def test_connection_reset_mid_body_resumes_with_range(server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(4 * MiB)
    server.add(PATH, data, reset_after=2 * MiB)

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.path.read_bytes() == data
    ranged = server.range_requests(PATH)
    assert len(ranged) == 1 and ranged[0].status == 206
    assert ranged[0].header("Range") == f"bytes={2 * MiB}-"
    resent = server.bytes_sent(PATH) - len(data)
    assert 0 <= resent < len(data) // 100
    assert got.bytes_transferred == len(data)


def test_truncated_body_is_resumed(server: FaultServer, data: bytes, tmp_path: Path) -> None:
    server.add(PATH, data, truncate_after=MiB)

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.path.read_bytes() == data
    assert [r.status for r in server.requests_for(PATH)] == [200, 206]
    assert server.range_requests(PATH)[0].header("Range") == f"bytes={MiB}-"


def test_server_ignoring_range_restarts_from_zero(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data, reset_after=MiB, ignore_range=True)

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.path.read_bytes() == data
    statuses = [(r.header("Range"), r.status) for r in server.requests_for(PATH)]
    assert statuses == [(None, 200), (f"bytes={MiB}-", 200)]
    assert not (tmp_path / (NAME + ".part")).exists()


def test_part_left_by_an_earlier_run_is_resumed(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data)
    (tmp_path / (NAME + ".part")).write_bytes(data[:MiB])

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.path.read_bytes() == data
    assert server.requests_for(PATH)[0].header("Range") == f"bytes={MiB}-"
    assert got.bytes_transferred == len(data) - MiB


def test_stale_part_from_another_file_is_discarded_after_mismatch(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data)
    (tmp_path / (NAME + ".part")).write_bytes(os.urandom(MiB))  # an older version's prefix

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.path.read_bytes() == data
    assert [r.header("Range") for r in server.requests_for(PATH)] == [f"bytes={MiB}-", None]


def test_416_on_an_oversized_part_restarts(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data)
    (tmp_path / (NAME + ".part")).write_bytes(os.urandom(len(data) + 10))

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.path.read_bytes() == data
    assert [r.status for r in server.requests_for(PATH)] == [416, 200]


# ----------------------------------------------------------------------------- integrity


def test_wrong_published_checksum_deletes_everything(
    origin: FaultServer, data: bytes, tmp_path: Path
) -> None:
    origin.add(PATH, data)
    wrong = origin.add_sha256sum(PATH, data, wrong=True)

    with pytest.raises(ChecksumMismatch) as info:
        fetch_file([origin.url(PATH)], tmp_path, NAME, settings=trusting(origin))

    assert wrong in info.value.message and sha(data) in info.value.message
    assert files_in(tmp_path) == []


def test_pin_mismatch_deletes_everything(server: FaultServer, data: bytes, tmp_path: Path) -> None:
    server.add(PATH, data)

    with pytest.raises(ChecksumMismatch) as info:
        fetch_file([server.url(PATH)], tmp_path, NAME, sha256="ab" * 32, settings=FAST)

    assert "ab" * 32 in info.value.message and sha(data) in info.value.message
    assert "pinned" in info.value.message
    assert files_in(tmp_path) == []
    assert server.count(PATH + ".sha256sum") == 0  # a pin needs no checksum file


# ----------------------------------------------------------------------------- mirrors


def test_second_mirror_used_when_the_first_fails(
    origin: FaultServer, data: bytes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    origin.add("/a" + PATH, data, fail_times=100, fail_status=502)
    origin.add("/b" + PATH, data)
    origin.add_sha256sum("/b" + PATH, data)

    got = fetch_file(
        [origin.url("/a" + PATH), origin.url("/b" + PATH)], tmp_path, NAME,
        settings=trusting(origin),
    )

    assert got.source == origin.url("/b" + PATH)
    assert got.verified_by == "trusted-origin"
    assert got.path.read_bytes() == data
    assert "source failed" in caplog.text


def test_unreachable_mirror_then_working_one(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    dead = FaultServer()
    dead_url = dead.url(PATH)
    dead.stop()  # the port is closed now: connection refused
    server.add(PATH, data)

    got = fetch_file([dead_url, server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.source == server.url(PATH)


def test_all_mirrors_failing_lists_each(server: FaultServer, tmp_path: Path) -> None:
    server.add("/a" + PATH, status=404)
    server.add("/b" + PATH, fail_times=100, fail_status=503)
    urls = [server.url("/a" + PATH), server.url("/b" + PATH)]

    with pytest.raises(DownloadFailed) as info:
        fetch_file(urls, tmp_path, NAME, sha256="a" * 64, settings=FAST)

    assert type(info.value) is DownloadFailed
    assert "all 2 sources failed" in info.value.message
    assert "/a/tesla" in info.value.message and "HTTP 404" in info.value.message
    assert "/b/tesla" in info.value.message and "HTTP 503" in info.value.message


def test_all_mirrors_404_is_not_found(server: FaultServer, tmp_path: Path) -> None:
    urls = [server.url("/a" + PATH), server.url("/b" + PATH)]  # unknown paths: 404

    with pytest.raises(DownloadNotFound):
        fetch_file(urls, tmp_path, NAME, sha256="a" * 64, settings=FAST)


# ----------------------------------------------------------------------------- cache


def test_cache_hit_needs_no_network(tls: Tls, data: bytes, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))
    with FaultServer(tls=tls.context) as srv:
        srv.add(PATH, data)
        srv.add_sha256sum(PATH, data)
        url = srv.url(PATH)
        settings = trusting(srv)
        first = fetch_file([url], tmp_path, NAME, settings=settings)
    # the server is gone: any network access would fail
    again = fetch_file([url], tmp_path, NAME, settings=settings)
    pinned = fetch_file([url], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert first.from_cache is False
    assert (again.from_cache, again.bytes_transferred, again.sha256) == (True, 0, sha(data))
    assert again.verified_by == "trusted-origin"
    assert (pinned.from_cache, pinned.verified_by) == (True, "pin")
    assert delivery.find_cached(tmp_path, NAME, sha256=sha(data)) is not None


def test_cache_with_a_different_pin_fetches_again(server: FaultServer, tmp_path: Path) -> None:
    old, new = os.urandom(MiB), os.urandom(MiB)
    server.add(PATH, old)
    fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(old), settings=FAST)
    server.add(PATH, new)

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(new), settings=FAST)

    assert (got.from_cache, got.path.read_bytes()) == (False, new)
    assert server.count(PATH) == 2


def test_cache_with_wrong_size_fetches_again(
    server: FaultServer, data: bytes, tmp_path: Path
) -> None:
    server.add(PATH, data)
    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)
    with got.path.open("ab") as handle:
        handle.write(b"tampered")

    again = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert again.from_cache is False and again.path.read_bytes() == data


# ----------------------------------------------------------------------------- host limits


def test_insufficient_space_is_reported_before_writing(
    server: FaultServer, data: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.add(PATH, data)
    real = delivery_part.shutil.disk_usage

    def tiny(path: object) -> object:
        return real(path)._replace(free=1000)  # type: ignore[arg-type]

    monkeypatch.setattr(delivery_part.shutil, "disk_usage", tiny)

    with pytest.raises(InsufficientSpace) as info:
        fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert server.count(PATH) == 1
    assert "only 0.0 MB free" in info.value.message
    assert not (tmp_path / NAME).exists()


# ----------------------------------------------------------------------------- proxies


def test_http_proxy_from_environment_is_used(
    server: FaultServer, data: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.add(PATH, data)
    with ForwardProxy(server) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        url = f"http://mirror.invalid{PATH}"  # never resolved: only the proxy can answer

        got = fetch_file([url], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.path.read_bytes() == data
    assert [r.path for r in proxy.requests] == [url]


def test_no_proxy_is_honoured_for_loopback(
    server: FaultServer, data: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.add(PATH, data)
    dead = FaultServer()
    dead_proxy = dead.base_url
    dead.stop()
    monkeypatch.setenv("HTTP_PROXY", dead_proxy)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")

    got = fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=FAST)

    assert got.path.read_bytes() == data


# ----------------------------------------------------------------------------- progress


def test_progress_logs_a_line_per_ten_percent(
    server: FaultServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = os.urandom(20 * MiB)
    server.add(PATH, data)
    caplog.set_level(logging.INFO, "installer.download")
    settings = DownloadSettings(progress="log")

    fetch_file([server.url(PATH)], tmp_path, NAME, sha256=sha(data), settings=settings)

    lines = [r.getMessage() for r in caplog.records if re.search(r": \d+% \(", r.getMessage())]
    assert [int(re.search(r"(\d+)%", m).group(1)) for m in lines] == list(  # type: ignore[union-attr]
        range(10, 101, 10)
    )
    assert all(re.search(r"\d+\.\d/21\.0 MB, \d+\.\d MB/s\)$", m) for m in lines)


# ----------------------------------------------------------------------------- fetch_bytes


def test_fetch_bytes_retries_and_returns_content(server: FaultServer) -> None:
    server.add("/releases.json", b'{"580": {}}', fail_times=1)

    assert fetch_bytes(server.url("/releases.json"), FAST, max_bytes=1000) == b'{"580": {}}'
    assert server.count("/releases.json") == 2


def test_fetch_bytes_limits_size(server: FaultServer) -> None:
    server.add("/big.json", b"x" * 5000)

    with pytest.raises(DownloadFailed, match="more than 1000"):
        fetch_bytes(server.url("/big.json"), FAST, max_bytes=1000)


def test_fetch_bytes_404(server: FaultServer) -> None:
    with pytest.raises(DownloadNotFound):
        fetch_bytes(server.url("/nope.json"), FAST, max_bytes=1000)
    assert server.count("/nope.json") == 1
