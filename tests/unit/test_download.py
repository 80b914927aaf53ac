"""installer.delivery without a network: URLs, checksums, settings, progress, file://, cache."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import logging
import os
from pathlib import Path

import pytest

from installer import delivery
from installer.delivery import (
    DownloadSettings,
    checksums,
    fetch_bytes,
    fetch_file,
    find_cached,
    parse_sha256sum,
    redact_url,
    transport,
    urls,
)
from installer.delivery.progress import Progress, resolve_mode
from installer.errors import (
    ChecksumMismatch,
    ConfigError,
    DownloadFailed,
    DownloadNotFound,
)

NAME = "NVIDIA-Linux-x86_64-580.95.05.run"
QUIET = DownloadSettings(retries=0, progress="none")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- redaction


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://example.com/a.run", "https://example.com/a.run"),
        ("https://user:pa55@example.com:8443/a.run", "https://***@example.com:8443/a.run"),
        ("https://token@example.com/a.run", "https://***@example.com/a.run"),
        ("http://u:p%40ss@h/x?y=1", "http://***@h/x?y=1"),
        (
            "https://b.s3.amazonaws.com/a.run?X-Amz-Credential=AKIA&X-Amz-Signature=abc&v=2",
            "https://b.s3.amazonaws.com/a.run?X-Amz-Credential=***&X-Amz-Signature=***&v=2",
        ),
        ("https://h/a?sig=zzz&token=t&x=", "https://h/a?sig=***&token=***&x="),
        ("file:///srv/mirror/a.run", "file:///srv/mirror/a.run"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_scrub_removes_credentials_from_library_messages() -> None:
    url = "https://robot:s3cr%40t@h.example/a.run?sig=abcdef"
    text = f"failed for {url} (user robot, password s3cr@t, sig abcdef)"
    scrubbed = urls.scrub(text, url)
    assert "s3cr" not in scrubbed and "robot" not in scrubbed and "abcdef" not in scrubbed
    assert "https://***@h.example/a.run?sig=***" in scrubbed


def test_split_credentials() -> None:
    assert urls.split_credentials("https://u:p%3Aq@h/x") == ("https://h/x", ("u", "p:q"))
    assert urls.split_credentials("https://h/x") == ("https://h/x", None)


# ----------------------------------------------------------------------------- checksums


def test_parse_sha256sum_nvidia_format() -> None:
    digest = "a" * 64
    assert parse_sha256sum(f"{digest}  {NAME}\n", NAME) == digest


def test_parse_sha256sum_picks_the_named_line() -> None:
    text = f"{'1' * 64}  other.run\n{'2' * 64} *{NAME}\n{'3' * 64}  ./sub/third.run\n"
    assert parse_sha256sum(text, NAME) == "2" * 64
    assert parse_sha256sum(text, "third.run") == "3" * 64
    assert parse_sha256sum(text, "missing.run") is None  # several lines, none named


def test_parse_sha256sum_single_digest_and_garbage() -> None:
    assert parse_sha256sum(("F" * 64) + "\n", NAME) == "f" * 64
    assert parse_sha256sum("<html>Sign in to the captive portal</html>", NAME) is None
    assert parse_sha256sum("", NAME) is None


def test_pin_is_normalized_and_validated() -> None:
    assert checksums.normalize_pin(" SHA256:" + "AB" * 32 + " ") == "ab" * 32
    with pytest.raises(ConfigError):
        checksums.normalize_pin("abc")


# ----------------------------------------------------------------------------- settings


def test_settings_defaults() -> None:
    settings = DownloadSettings()
    assert (settings.retries, settings.connect_timeout, settings.read_timeout) == (5, 10.0, 60.0)
    assert settings.progress == "auto"


@pytest.mark.parametrize(
    "kwargs",
    [{"retries": -1}, {"read_timeout": 0}, {"backoff_initial": -1}, {"progress": "fancy"}],
)
def test_settings_reject_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        DownloadSettings(**kwargs)  # type: ignore[arg-type]


def test_retry_after_parsing() -> None:
    assert transport.parse_retry_after("7") == 7.0
    assert transport.parse_retry_after(None) is None
    assert transport.parse_retry_after("soon") is None
    assert transport.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past


# ----------------------------------------------------------------------------- module shape


def test_requests_and_tenacity_are_imported_lazily() -> None:
    top_level: set[str] = set()
    package = Path(delivery.__file__).parent
    nodes = [n for f in sorted(package.glob("*.py")) for n in ast.parse(f.read_text()).body]
    for node in nodes:
        if isinstance(node, ast.Import):
            top_level.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top_level.add(node.module.split(".")[0])
    assert not top_level & {"requests", "tenacity", "urllib3"}


# ----------------------------------------------------------------------------- progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_log_mode_reports_each_tenth_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    caplog.set_level(logging.INFO, "installer.download")
    progress = Progress("f.run", 100_000_000, mode="log", clock=clock)
    for _ in range(400):
        clock.now += 0.01
        progress.update(250_000)
    progress.finish()

    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 10
    assert lines[0] == "f.run: 10% (10.0/100.0 MB, 25.0 MB/s)"
    assert lines[-1].startswith("f.run: 100% (100.0/100.0 MB")


def test_progress_resumed_transfer_reports_only_remaining_tenths(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "installer.download")
    progress = Progress("f.run", 1000, mode="log", start=450, clock=FakeClock())
    for _ in range(55):
        progress.update(10)
    assert [r.getMessage().split("%")[0] for r in caplog.records] == [
        f"f.run: {p}" for p in range(50, 101, 10)
    ]


def test_progress_bar_mode_draws_one_line() -> None:
    clock = FakeClock()
    stream = io.StringIO()
    progress = Progress("f.run", 1_000_000, mode="bar", stream=stream, clock=clock)
    for _ in range(10):
        clock.now += 1
        progress.update(100_000)
    progress.finish()
    out = stream.getvalue()
    assert out.endswith("\n") and out.count("\n") == 1
    assert "100%" in out and "\r" in out


def test_progress_none_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    progress = Progress("f.run", 10, mode="none")
    progress.update(10)
    progress.finish()
    assert caplog.records == []


def test_auto_mode_follows_the_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert resolve_mode("auto", Tty()) == "bar"
    assert resolve_mode("auto", io.StringIO()) == "log"
    assert resolve_mode("none", Tty()) == "none"


# ----------------------------------------------------------------------------- file:// sources


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    directory = tmp_path / "mirror"
    directory.mkdir()
    return directory


def put(mirror: Path, data: bytes, *, checksum: str | None = None) -> str:
    (mirror / NAME).write_bytes(data)
    if checksum is not None:
        (mirror / (NAME + ".sha256sum")).write_text(f"{checksum}  {NAME}\n")
    return (mirror / NAME).as_uri()


def test_file_source_verified_by_checksum_beside_it(mirror: Path, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    url = put(mirror, data, checksum=sha(data))

    got = fetch_file([url], tmp_path / "dl", NAME, settings=QUIET)

    assert got.path.read_bytes() == data
    assert (got.verified_by, got.from_cache, got.bytes_transferred) == (
        "local-sha256sum",
        False,
        len(data),
    )
    record = json.loads((tmp_path / "dl" / (NAME + ".download.json")).read_text())
    assert record["sha256"] == sha(data) and record["size"] == len(data)
    assert not (tmp_path / "dl" / (NAME + ".part")).exists()


def test_file_source_without_checksum_is_unverified(
    mirror: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = put(mirror, b"payload")
    got = fetch_file([url], tmp_path / "dl", NAME, settings=QUIET)
    assert got.verified_by == "none"
    assert "will not be verified" in caplog.text


def test_file_source_bad_checksum(mirror: Path, tmp_path: Path) -> None:
    url = put(mirror, b"payload", checksum="0" * 64)
    with pytest.raises(ChecksumMismatch) as info:
        fetch_file([url], tmp_path / "dl", NAME, settings=QUIET)
    assert "0" * 64 in info.value.message and sha(b"payload") in info.value.message
    assert list((tmp_path / "dl").iterdir()) == []


def test_missing_file_source_then_next_source(mirror: Path, tmp_path: Path) -> None:
    url = put(mirror, b"payload")
    missing = (mirror / "nope.run").as_uri()

    with pytest.raises(DownloadNotFound):
        fetch_file([missing], tmp_path / "dl", NAME, settings=QUIET)
    got = fetch_file([missing, url], tmp_path / "dl", NAME, sha256=sha(b"payload"), settings=QUIET)
    assert got.source == url and got.verified_by == "pin"


def test_unsupported_scheme(tmp_path: Path) -> None:
    with pytest.raises(DownloadFailed, match="unsupported URL scheme 'ftp'"):
        fetch_file(["ftp://h/a.run"], tmp_path, NAME, settings=QUIET)


def test_filename_must_be_plain(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        fetch_file(["file:///x"], tmp_path, "../x.run", settings=QUIET)


# ----------------------------------------------------------------------------- cache


def test_cache_reused_after_the_source_is_gone(mirror: Path, tmp_path: Path) -> None:
    data = os.urandom(100_000)
    url = put(mirror, data, checksum=sha(data))
    fetch_file([url], tmp_path / "dl", NAME, settings=QUIET)
    (mirror / NAME).unlink()

    got = fetch_file([url], tmp_path / "dl", NAME, settings=QUIET)

    assert (got.from_cache, got.bytes_transferred, got.verified_by) == (
        True,
        0,
        "local-sha256sum",
    )
    assert find_cached(tmp_path / "dl", NAME) == got
    assert find_cached(tmp_path / "dl", NAME, sha256="1" * 64) is None


def test_file_placed_by_hand_is_adopted_when_the_pin_matches(tmp_path: Path) -> None:
    (tmp_path / NAME).write_bytes(b"hand placed")

    got = fetch_file(["file:///nonexistent/x.run"], tmp_path, NAME, sha256=sha(b"hand placed"))

    assert (got.from_cache, got.verified_by, got.source) == (True, "pin", "already present")
    assert find_cached(tmp_path, NAME, sha256=sha(b"hand placed")) is not None


def test_failed_download_keeps_a_file_placed_by_hand(tmp_path: Path) -> None:
    (tmp_path / NAME).write_bytes(b"placed by an operator")

    with pytest.raises(DownloadNotFound):
        fetch_file([(tmp_path / "missing.run").as_uri()], tmp_path, NAME, settings=QUIET)

    assert (tmp_path / NAME).read_bytes() == b"placed by an operator"


def test_find_cached_is_read_only(tmp_path: Path) -> None:
    (tmp_path / NAME).write_bytes(b"no record")
    assert find_cached(tmp_path, NAME, sha256=sha(b"no record")) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME]


# ----------------------------------------------------------------------------- fetch_bytes


def test_fetch_bytes_file_url(tmp_path: Path) -> None:
    path = tmp_path / "releases.json"
    path.write_bytes(b"{}")
    assert fetch_bytes(path.as_uri(), QUIET, max_bytes=10) == b"{}"
    with pytest.raises(DownloadFailed, match="larger than 1 bytes"):
        fetch_bytes(path.as_uri(), QUIET, max_bytes=1)
    with pytest.raises(DownloadNotFound):
        fetch_bytes((tmp_path / "missing").as_uri(), QUIET, max_bytes=10)
