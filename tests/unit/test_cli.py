from __future__ import annotations

import json
from pathlib import Path

import pytest
from hosttrees import make_host, root_env

from installer import cli


def invoke(monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str]) -> int:
    for key in list(__import__("os").environ):
        if key.startswith(("NVIDIA_", "ROOT_MOUNT_DIR")):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    return int(info.value.code or 0)


def test_known_errors_print_reference_and_hint_and_fill_the_termination_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    termination = tmp_path / "termination-log"
    termination.write_text("")
    code = invoke(
        monkeypatch,
        ["plan"],
        root_env(tmp_path / "empty", NVIDIA_INSTALLER_TERMINATION_LOG=str(termination)),
    )
    err = capsys.readouterr().err
    assert code == 14
    assert err.startswith("error[unsupported-distro]: no os-release found")
    assert "\nhint: " in err
    assert termination.read_text().startswith("error[unsupported-distro]")


def test_the_termination_log_flag_takes_the_place_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_flag, by_env = tmp_path / "by-flag", tmp_path / "by-env"
    by_flag.write_text("")
    by_env.write_text("")
    env = root_env(tmp_path / "empty", NVIDIA_INSTALLER_TERMINATION_LOG=str(by_env))
    code = invoke(monkeypatch, ["plan", "--termination-log", str(by_flag)], env)
    assert code == 14
    assert by_flag.read_text().startswith("error[unsupported-distro]: no os-release found")
    assert "\nhint: " in by_flag.read_text()
    assert by_env.read_text() == ""


def test_the_termination_log_flag_also_gets_the_error_of_another_bad_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_flag = tmp_path / "by-flag"
    by_flag.write_text("")
    code = invoke(monkeypatch, ["run", "--termination-log", str(by_flag), "--source", "apt"], {})
    assert code == 10
    assert by_flag.read_text().startswith("error[invalid-config]: NVIDIA_DRIVER_SOURCE='apt'")


def test_config_errors_exit_with_their_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = invoke(monkeypatch, ["plan"], {"NVIDIA_DRIVER_SOURCE": "apt"})
    assert code == 10
    assert "error[invalid-config]: NVIDIA_DRIVER_SOURCE='apt'" in capsys.readouterr().err


def test_usage_errors_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    assert invoke(monkeypatch, ["run", "--no-such-flag"], {}) == 2


def test_plan_on_a_host_without_gpu_explains_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64")
    code = invoke(monkeypatch, ["plan", "--version", "550"], root_env(tmp_path))
    out = capsys.readouterr().out
    assert code == 0
    assert "gpu: none found in /sys/bus/pci/devices" in out
    assert "run fails with no-nvidia-gpu unless --allow-no-gpu" in out
    assert "version: 550." in out


def test_status_is_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64")
    code = invoke(
        monkeypatch, ["status", "--log-format", "json"], root_env(tmp_path)
    )
    assert code == 0
    status = json.loads(capsys.readouterr().out)
    assert status["loaded_driver"] is None and status["ready"] is False


def test_versions_lists_branches(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert invoke(monkeypatch, ["versions"], {}) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("R580") and "lts branch" in line for line in lines)


@pytest.mark.parametrize(("version", "expected"), [("580.105.08", "580.105.08"), ("R580", None),
                                                   ("auto", None)])
def test_verify_without_a_record_expects_only_an_exact_pin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, expected: str | None
) -> None:
    from installer import app, verify
    from installer.config import from_env

    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64")
    seen: dict[str, object] = {}
    monkeypatch.setattr(verify, "verify", lambda **kwargs: seen.update(kwargs))
    app.verify_installed(from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=version)))
    assert seen["expected_version"] == expected


def test_termination_log_keeps_the_reference_of_a_long_message_within_4096_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from installer.errors import ModuleBuildFailed

    termination = tmp_path / "termination-log"
    termination.write_text("")
    monkeypatch.setenv("NVIDIA_INSTALLER_TERMINATION_LOG", str(termination))
    long_tail = "\n".join(f"cc1: error: ünsupported option {i}" for i in range(400))
    cli.report_error(ModuleBuildFailed("building failed; last lines:\n" + long_tail))
    data = termination.read_bytes()
    assert data.startswith(b"error[module-build-failed]: building failed")
    assert len(data) <= 4096
    data.decode("utf-8")  # not cut inside a character
    assert b"\nhint: See the compiler output" in data
    assert "option 399\nhint:" in capsys.readouterr().err  # stderr keeps everything
