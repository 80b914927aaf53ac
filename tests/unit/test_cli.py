from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest
from lib.cli import invoke
from lib.hosttrees import make_host, root_env

from installer import cli


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
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", headers=True)
    code = invoke(monkeypatch, ["plan", "--version", "550"], root_env(tmp_path))
    out = capsys.readouterr().out
    assert code == 0
    assert "gpu: none found in /sys/bus/pci/devices" in out
    assert "run fails with no-nvidia-gpu unless --allow-no-gpu" in out
    assert "version: 550." in out


def test_status_is_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", headers=True)
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

    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", headers=True)
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


# A bare `installer run` (the images' command) runs without importing click (the warm path's
# cost); with any flag it goes through click's `run` command. Both must end alike.
BARE_RUN = ["run"]
CLICK_RUN = ["run", "--verbose"]


@pytest.mark.parametrize("args", [BARE_RUN, CLICK_RUN])
def test_run_takes_its_settings_from_the_environment_with_or_without_click(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    from installer import app
    from installer.config import from_env

    seen: list[object] = []
    monkeypatch.setattr(app, "run", seen.append)
    env = {"NVIDIA_DRIVER_VERSION": "R580", "NVIDIA_INSTALLER_RETRIES": "3"}
    assert invoke(monkeypatch, args, env) == 0
    assert seen == [from_env(os.environ)]
    assert seen[0].version == "R580" and seen[0].retries == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("args", [BARE_RUN, CLICK_RUN])
def test_a_bad_setting_fails_run_alike_with_or_without_click(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert invoke(monkeypatch, args, {"NVIDIA_DRIVER_SOURCE": "apt"}) == 10
    assert capsys.readouterr().err.startswith("error[invalid-config]: NVIDIA_DRIVER_SOURCE='apt'")


@pytest.mark.parametrize("args", [BARE_RUN, CLICK_RUN])
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, EOFError])
def test_an_interrupted_run_says_aborted_and_exits_130_with_or_without_click(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str],
    interrupt: type[BaseException],
) -> None:
    from installer import app

    def interrupted(config: object) -> None:
        raise interrupt()

    monkeypatch.setattr(app, "run", interrupted)
    assert invoke(monkeypatch, args, {}) == 130
    assert capsys.readouterr().err == "\naborted\n"


@pytest.mark.parametrize("args", [BARE_RUN, CLICK_RUN])
def test_a_closed_pipe_ends_run_with_1_and_no_traceback_with_or_without_click(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    from installer import app

    def closed(config: object) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", sys.stdout)  # restored after click wraps them
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(app, "run", closed)
    assert invoke(monkeypatch, args, {}) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("args", [BARE_RUN, CLICK_RUN])
def test_an_unexpected_failure_of_run_prints_its_traceback_and_exits_1_with_or_without_click(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    from installer import app

    def broken(config: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app, "run", broken)
    assert invoke(monkeypatch, args, {}) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith("RuntimeError: a bug\n")
