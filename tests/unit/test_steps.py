from __future__ import annotations

from pathlib import Path

import pytest
from lib.contexts import context
from lib.fakes import FakeRunner
from lib.hosttrees import write_proc_modules

from installer import pipeline, steps
from installer.errors import InstallFailed, NouveauActive, SecureBootKeysMissing
from installer.plan import Plan, Step


def test_secure_boot_without_keys_stops_the_plan(tmp_path: Path) -> None:
    ctx = context(tmp_path, FakeRunner(), secure_boot=True)
    step = steps.secure_boot_step(ctx)
    assert not step.is_satisfied()
    with pytest.raises(SecureBootKeysMissing) as info:
        pipeline.run_step(step)
    assert "Secure Boot is enabled" in info.value.message


def test_secure_boot_with_keys_is_satisfied(tmp_path: Path) -> None:
    ctx = context(
        tmp_path,
        FakeRunner(),
        secure_boot=True,
        NVIDIA_MODULE_SIGNING_KEY="/k.priv",
        NVIDIA_MODULE_SIGNING_CERT="/k.der",
    )
    assert steps.secure_boot_step(ctx).is_satisfied()


def test_nouveau_unloaded_and_blacklisted(tmp_path: Path) -> None:
    def unloaded(argv: object) -> None:
        write_proc_modules(tmp_path, [])

    runner = FakeRunner().on("rmmod", effect=unloaded)
    ctx = context(tmp_path, runner, modules=("nouveau 2359296 0 - Live 0x0",))
    pipeline.run_step(steps.nouveau_step(ctx))
    assert runner.argvs() == [["rmmod", "nouveau"]]
    assert (tmp_path / "etc/modprobe.d/blacklist-nouveau.conf").read_text() == (
        "blacklist nouveau\noptions nouveau modeset=0\n"
    )


def test_nouveau_in_use_needs_a_reboot(tmp_path: Path) -> None:
    runner = FakeRunner().on("rmmod", returncode=1, output="rmmod: ERROR: Module nouveau is in use")
    ctx = context(tmp_path, runner, modules=("nouveau 2359296 3 - Live 0x0",))
    with pytest.raises(NouveauActive) as info:
        pipeline.run_step(steps.nouveau_step(ctx))
    assert "Reboot the node" in info.value.hint
    assert (tmp_path / "etc/modprobe.d/blacklist-nouveau.conf").is_file()


def test_a_step_whose_check_still_fails_after_apply_is_an_error() -> None:
    step = Step("noop", "does nothing", lambda: False, lambda: None)
    with pytest.raises(InstallFailed, match="step noop finished but its check still fails"):
        pipeline.run_step(step)


def test_execute_applies_only_what_is_needed(tmp_path: Path) -> None:
    done: list[str] = []
    flag = {"b": False}

    def apply_b() -> None:
        done.append("b")
        flag["b"] = True

    plan_steps = [
        Step("a", "", lambda: True, lambda: done.append("a")),
        Step("b", "", lambda: flag["b"], apply_b),
    ]
    ctx = context(tmp_path, FakeRunner())
    outcomes = pipeline.execute(Plan(ctx, [], plan_steps))
    assert done == ["b"]
    assert [(o.name, o.status) for o in outcomes] == [("a", "satisfied"), ("b", "applied")]


def test_record_writes_state_and_gkes_cache_but_not_readiness(tmp_path: Path) -> None:
    ctx = context(tmp_path, FakeRunner())
    ctx.layout.install_local.mkdir(parents=True)
    step = steps.record_step(ctx)
    pipeline.run_step(step)
    assert step.is_satisfied()
    assert (ctx.layout.install_local / ".cache").read_text() == (
        "CACHE_KERNEL_VERSION=5.15.0-105-generic\nCACHE_NVIDIA_DRIVER_VERSION=580.105.08\n")
    assert not (tmp_path / "run/nvidia-driver-installer/driver-ready").exists()
