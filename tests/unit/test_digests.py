"""The operator's digests file and the trusted origins: who may vouch for a download."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.config import from_env
from installer.delivery.digests import (
    Listed,
    format_digests,
    is_trusted,
    origin_of,
    parse_digests,
    read_digests,
)
from installer.errors import ConfigError, DigestsFileInvalid

A = "a" * 64
B = "b" * 64
RUN = "NVIDIA-Linux-x86_64-580.105.08.run"
FM = "fabricmanager-linux-x86_64-580.105.08-archive.tar.xz"
NVIDIA = ("https://download.nvidia.com", "https://developer.download.nvidia.com")


def test_sha256sum_output_and_sizes_are_read() -> None:
    text = f"# from installer download\n{A}  {RUN}  1234\n{B.upper()} *{FM}\n\n"
    assert parse_digests(text, "f") == {RUN: Listed(A, 1234), FM: Listed(B, None)}


@pytest.mark.parametrize("line", [
    f"{A[:-1]}  {RUN}",  # 63 digits
    f"{A}  ../{RUN}",  # a path, not a file name
    f"{A}  {RUN}  12k",  # a size that is not a number
    f"{A}  {RUN}  1  extra",
    f"md5:{A}  {RUN}",
])
def test_a_line_that_is_not_an_entry_is_an_error_naming_it(line: str) -> None:
    with pytest.raises(DigestsFileInvalid) as info:
        parse_digests(f"{B}  other.run\n{line}\n", "/etc/digests")
    assert "/etc/digests, line 2" in info.value.message
    assert info.value.exit_code == 28 and info.value.reference == "digests-file-invalid"


def test_one_name_with_two_digests_is_an_error() -> None:
    with pytest.raises(DigestsFileInvalid, match="twice"):
        parse_digests(f"{A}  {RUN}\n{B}  {RUN}\n", "f")


def test_an_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DigestsFileInvalid, match="cannot read"):
        read_digests(tmp_path / "missing")


def test_format_is_read_back(tmp_path: Path) -> None:
    entries = {RUN: Listed(A, 1234), FM: Listed(B, None)}
    (tmp_path / "digests").write_text(format_digests(entries))
    assert read_digests(tmp_path / "digests") == entries


@pytest.mark.parametrize(("url", "trusted"), [
    ("https://download.nvidia.com/XFree86/Linux-x86_64/580.105.08/x.run.sha256sum", True),
    ("https://DOWNLOAD.nvidia.com:443/x", True),
    ("https://developer.download.nvidia.com/compute/nvidia-driver/redist/r.json", True),
    ("http://download.nvidia.com/x.sha256sum", False),  # plain http: anyone on the path
    ("https://download.nvidia.com.evil.example/x", False),
    ("https://download.nvidia.com:8443/x", False),
    ("https://mirror.local/x", False),
    ("file:///srv/x.sha256sum", False),
])
def test_only_https_on_a_named_origin_is_trusted(url: str, trusted: bool) -> None:
    assert is_trusted(url, NVIDIA) is trusted


def test_origins_compare_host_and_port() -> None:
    assert origin_of("https://127.0.0.1:8443/a/b") == "https://127.0.0.1:8443"
    assert is_trusted("https://127.0.0.1:8443/a", ("https://127.0.0.1:8443/",))
    assert not is_trusted("https://127.0.0.1:8444/a", ("https://127.0.0.1:8443",))


def test_settings_default_to_nvidia_and_refuse_plain_http(tmp_path: Path) -> None:
    config = from_env({})
    assert "https://download.nvidia.com" in config.trusted_origins
    assert config.digests_file is None
    with pytest.raises(ConfigError, match="NVIDIA_DRIVER_TRUSTED_ORIGINS"):
        from_env({"NVIDIA_DRIVER_TRUSTED_ORIGINS": "http://mirror.local"})
    with pytest.raises(ConfigError, match="NVIDIA_DRIVER_DIGESTS_FILE"):
        from_env({"NVIDIA_DRIVER_DIGESTS_FILE": "digests"})
    assert from_env({"NVIDIA_DRIVER_TRUSTED_ORIGINS": ""}).trusted_origins == ()


# ------------------------------------------------------------- `installer plan` says who vouches

def plan_decisions(tmp_path: Path, **env: str) -> dict[str, str]:
    from lib.fakes import FakeRunner
    from lib.hosttrees import CLASS_BRIDGE, add_pci_device, make_host, root_env

    from installer import planner

    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", gpus=[0x2330, 0x2330])
    for address in ("0000:05:00.0", "0000:06:00.0"):  # NVSwitch: Fabric Manager is planned
        add_pci_device(tmp_path, address, device=0x22A3, klass=CLASS_BRIDGE)
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION="580.105.08", **env))
    plan = planner.make_plan(config, FakeRunner(), fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)
    return {d.topic: f"{d.value} ({d.reason})" for d in plan.decisions}


def test_plan_names_nvidias_origin_by_default(tmp_path: Path) -> None:
    said = plan_decisions(tmp_path / "host")
    assert said["runfile-digest"] == (
        f"{RUN} (its SHA-256 from https://us.download.nvidia.com/tesla/580.105.08/{RUN}"
        ".sha256sum (a trusted origin, over TLS, if published there))")
    assert said["fabric-manager"].endswith(
        "its SHA-256 from https://developer.download.nvidia.com/compute/nvidia-driver/redist/"
        "redistrib_580.105.08.json (a trusted origin, over TLS, if published there))")


def test_plan_names_the_pin_and_the_digests_file(tmp_path: Path) -> None:
    digests = tmp_path / "digests"
    digests.write_text(f"{A}  {FM}  42\n")
    said = plan_decisions(tmp_path / "host", NVIDIA_DRIVER_SHA256=B,
                          NVIDIA_DRIVER_DIGESTS_FILE=str(digests))
    assert said["runfile-digest"].endswith("(its SHA-256 from NVIDIA_DRIVER_SHA256 (pin))")
    assert said["fabric-manager"].endswith(f"its SHA-256 from digests file {digests})")


def test_plan_says_a_mirror_alone_vouches_for_nothing(tmp_path: Path) -> None:
    said = plan_decisions(tmp_path / "host", NVIDIA_DRIVER_DOWNLOAD_URL="http://mirror.local/x.run",
                          NVIDIA_FABRICMANAGER_REDIST="http://mirror.local/redist")
    refused = ("none: no pin, no digests-file entry, no trusted https origin among the "
               "sources: the run refuses (download-unverified)")
    assert said["runfile-digest"] == f"{RUN} (its SHA-256 from {refused})"
    assert said["fabric-manager"].endswith(f"its SHA-256 from {refused})")


def test_plan_says_a_file_source_needs_no_vouching(tmp_path: Path) -> None:
    said = plan_decisions(tmp_path / "host", NVIDIA_DRIVER_DOWNLOAD_URL="file:///srv/x.run")
    assert said["runfile-digest"] == (
        f"{RUN} (its SHA-256 from file:///srv/x.run.sha256sum when present (a file:// source "
        "is the operator's own and needs none))")
