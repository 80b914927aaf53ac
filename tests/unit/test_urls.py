"""URLs from settings and catalogs: credentials never shown, control characters refused,
a remote catalog never names a local file (URLs reach logs, and a catalog from a server must not
make root read or run a file of the node)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from lib.cli import invoke
from lib.hosttrees import make_host

from installer.config import from_env
from installer.delivery import fetch_bytes, redact_url
from installer.errors import CatalogUnavailable, ConfigError, DownloadFailed
from installer.release import catalog

SECRETS = ("s3cr3t", "robot", "T0KEN")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def secret_url(port: int, path: str = "/x.run") -> str:
    return f"http://robot:s3cr3t@127.0.0.1:{port}{path}?X-Amz-Signature=T0KEN&v=1"


def test_plan_shows_no_credentials_of_the_download_url_or_mirrors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", headers=True)
    port = closed_port()
    for env in (
        {"NVIDIA_DRIVER_DOWNLOAD_URL": secret_url(port)},
        {"NVIDIA_DRIVER_MIRRORS": f"{secret_url(port, '/a')},http://robot:s3cr3t@127.0.0.1/b"},
    ):
        code = invoke(
            monkeypatch,
            ["plan", "--version", "550.54.15"],
            {"ROOT_MOUNT_DIR": str(tmp_path), **env},
        )
        captured = capsys.readouterr()
        assert code == 0
        assert "download: http://***@127.0.0.1" in captured.out
        for secret in SECRETS:
            assert secret not in captured.out + captured.err


def test_run_logs_records_and_terminates_without_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "host"
    make_host(root, distro="debian-12", kernel="6.1.0-56-amd64", headers=True)
    termination = tmp_path / "termination-log"
    termination.write_text("")
    code = invoke(
        monkeypatch,
        ["run", "--version", "550.54.15", "--allow-no-gpu"],
        {
            "ROOT_MOUNT_DIR": str(root),
            "NVIDIA_DRIVER_DOWNLOAD_URL": secret_url(closed_port()),
            "NVIDIA_DRIVER_SHA256": "a" * 64,  # vouched for: the download is attempted
            "NVIDIA_INSTALLER_RETRIES": "1",
            "NVIDIA_INSTALLER_TERMINATION_LOG": str(termination),
        },
    )
    captured = capsys.readouterr()
    assert code == 20  # download-failed: nothing listens there
    assert "plan: download = http://***@127.0.0.1" in captured.err
    written = termination.read_text()
    assert written.startswith("error[download-failed]") and "***@127.0.0.1" in written
    records = [p.read_text() for p in root.rglob("*.json")]
    for secret in SECRETS:
        assert secret not in captured.out + captured.err + written
        assert all(secret not in text for text in records)


def test_redaction_covers_userinfo_and_signed_query_values() -> None:
    shown = redact_url("https://u:p@h/x.run?X-Amz-Signature=abc&sig=def&v=1")
    assert shown == "https://***@h/x.run?X-Amz-Signature=***&sig=***&v=1"


@pytest.mark.parametrize("bad", ["\n", "\r\n", "\t", "\x00", "\x7f", "\x85"])
def test_urls_with_control_characters_are_refused_in_settings(bad: str) -> None:
    url = "https://mirror.example/x.run"
    for env in (
        {"NVIDIA_DRIVER_DOWNLOAD_URL": url + bad},
        {"NVIDIA_DRIVER_DOWNLOAD_URL": url.replace("x.run", f"x{bad}.run")},
        {"NVIDIA_DRIVER_MIRRORS": "https://mirror.example/pub" + bad.strip("\n\r\t ")}
        if bad.strip() else {"NVIDIA_DNF_REPO_URL": url + bad},
    ):
        with pytest.raises(ConfigError) as info:
            from_env(env)
        assert "control character" in info.value.message


def test_delivery_refuses_control_characters_before_any_request() -> None:
    with pytest.raises(DownloadFailed) as info:
        fetch_bytes("http://127.0.0.1:9/x.run\n")
    assert "control character '\\n' at 24" in info.value.message


def remote_catalog(url: str) -> bytes:
    return json.dumps(
        {
            "550": {
                "type": "lts branch",
                "driver_info": [
                    {"release_version": "550.54.15", "runfile_url": {"x86_64": url}}
                ],
            }
        }
    ).encode()


@pytest.mark.parametrize("url", ["file:///usr/bin/evil.run", "FILE:///tmp/x.run"])
def test_a_remote_catalog_may_not_name_a_local_file(url: str) -> None:
    with pytest.raises(CatalogUnavailable) as info:
        catalog.load("https://catalog.example/releases.json", lambda _: remote_catalog(url))
    assert "http:// and https:// URLs only" in info.value.message


def test_the_operators_own_catalog_may_name_a_local_file(tmp_path: Path) -> None:
    path = tmp_path / "releases.json"
    path.write_bytes(remote_catalog("file:///srv/mirror/x.run"))
    for source in (str(path), path.as_uri()):
        loaded = catalog.load(source, lambda url: Path(url[len("file://"):]).read_bytes())
        assert loaded.branches[0].releases[0].runfile_url("x86_64") == "file:///srv/mirror/x.run"


def test_a_catalog_url_with_a_control_character_is_malformed() -> None:
    with pytest.raises(CatalogUnavailable) as info:
        catalog.load(
            "https://catalog.example/releases.json",
            lambda _: remote_catalog("https://mirror.example/x.run\n"),
        )
    assert "control character" in info.value.message
