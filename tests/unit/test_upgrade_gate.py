"""The upgrade gate (installer/cluster/upgrade_gate.py): the planner chooses it once from the
switch; the refusing gate refuses a held driver and restores a node left mid-upgrade; the cluster
gate hands each moment to the upgrade protocol (faked here: tests/cluster drives the real one)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from lib.contexts import NEW, OLD, held_host
from lib.fakes import FakeRunner
from lib.hosttrees import make_host, root_env

from installer import app, pipeline, planner
from installer.cluster import protocol, upgrade_gate
from installer.config import from_env
from installer.errors import ClusterApiUnavailable, DriverInUse, InstallFailed
from installer.layout import Layout
from installer.plan import Plan, Step

ON = {"NVIDIA_INSTALLER_UPGRADE_PROTOCOL": "true", "NODE_NAME": "gpu-1"}


def plan_for(tmp_path: Path, **env: str) -> Plan:
    make_host(tmp_path, gpus=[0x2330])
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION="580.105.08", **env))
    return planner.make_plan(config, FakeRunner(), fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)


@pytest.mark.parametrize(("env", "kind"), [({}, upgrade_gate.RefusingGate),
                                           (ON, upgrade_gate.ClusterGate)], ids=["off", "on"])
def test_the_planner_chooses_the_gate_once_from_the_switch(
        tmp_path: Path, env: dict[str, str], kind: type) -> None:
    plan = plan_for(tmp_path, **env)
    gate = plan.context.upgrade_gate
    assert isinstance(gate, kind)
    assert upgrade_gate.of(plan.context) is gate  # the steps and app ask this one object


def test_a_context_built_without_the_planner_gets_its_gate_once(tmp_path: Path) -> None:
    ctx = held_host(tmp_path, **ON)
    assert ctx.upgrade_gate is None
    gate = upgrade_gate.of(ctx)
    assert isinstance(gate, upgrade_gate.ClusterGate) and upgrade_gate.of(ctx) is gate


def test_the_marker_name_is_the_protocols() -> None:
    assert upgrade_gate.MID_UPGRADE_MARKER == protocol.HINT_NAME


# --------------------------------------------------------------------------- refusing gate


def test_the_refusing_gate_refuses_a_held_driver_before_staging_and_before_the_unload(
        tmp_path: Path) -> None:
    ctx = held_host(tmp_path)
    gate = upgrade_gate.RefusingGate()
    holders = ["pid 4242 (nvidia-device-p) holds /dev/nvidia0"]
    with pytest.raises(DriverInUse) as before:
        gate.preflight(ctx, holders)
    assert before.value.message == ("the loaded NVIDIA driver is in use and cannot be replaced; "
                                    "processes holding /dev/nvidia*: " + holders[0])
    with pytest.raises(DriverInUse) as unload:
        gate.free_driver(ctx, holders, OLD, NEW, "the packages were left as they were")
    assert unload.value.message == before.value.message + "; the packages were left as they were"
    assert not gate.cleared_to_stage and not gate.freed
    assert ctx.runner.calls == []  # nothing unloaded


def test_the_refusing_gate_loads_no_cluster_code_on_a_clean_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import installer.cluster

    ctx = held_host(tmp_path)
    monkeypatch.delitem(sys.modules, "installer.cluster.protocol")
    monkeypatch.delattr(installer.cluster, "protocol")  # so that an import would load it again
    gate = upgrade_gate.RefusingGate()
    gate.finished(ctx.config, ctx.layout)
    gate.failed(ctx.config, ctx.layout, InstallFailed("boom"))
    assert "installer.cluster.protocol" not in sys.modules


def test_the_refusing_gate_restores_a_node_an_earlier_run_left_mid_upgrade(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = held_host(tmp_path, NODE_NAME="gpu-1")
    restored: list[tuple[Any, Layout]] = []
    monkeypatch.setattr(protocol, "finish_switched_off",
                        lambda config, layout: restored.append((config, layout)))
    gate = upgrade_gate.RefusingGate()
    gate.finished(ctx.config, ctx.layout)
    assert restored == []  # no marker: nothing to restore
    protocol.hint_path(ctx.layout).parent.mkdir(parents=True, exist_ok=True)
    protocol.hint_path(ctx.layout).write_text(f"{OLD} -> {NEW}\n")
    gate.failed(ctx.config, ctx.layout, InstallFailed("boom"))
    assert restored == []  # a failed run restores nothing
    gate.finished(ctx.config, ctx.layout)
    assert restored == [(ctx.config, ctx.layout)]


def test_without_node_name_the_marker_is_an_error(tmp_path: Path) -> None:
    ctx = held_host(tmp_path)
    protocol.hint_path(ctx.layout).parent.mkdir(parents=True, exist_ok=True)
    protocol.hint_path(ctx.layout).write_text(f"{OLD} -> {NEW}\n")
    with pytest.raises(ClusterApiUnavailable, match="NODE_NAME is unset: cannot restore it"):
        upgrade_gate.RefusingGate().finished(ctx.config, ctx.layout)


# --------------------------------------------------------------------------- cluster gate


def test_the_cluster_gate_asks_the_api_before_staging(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = held_host(tmp_path, **ON)
    asked: list[str | None] = []
    monkeypatch.setattr(protocol, "preflight", lambda config: asked.append(config.node_name))
    gate = upgrade_gate.ClusterGate()
    assert not gate.cleared_to_stage
    gate.preflight(ctx, ["pid 4242 (nvidia-device-p) holds /dev/nvidia0"])
    assert asked == ["gpu-1"] and gate.cleared_to_stage and not gate.freed


def record_pause_and_resume(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Our daemons' pause and resume replaced by entries in the returned list."""
    from installer.components import lifecycle

    events: list[object] = []
    monkeypatch.setattr(lifecycle, "pause", lambda root, layout, config: events.append("pause"))
    monkeypatch.setattr(lifecycle, "resume", lambda root: events.append("resume"))
    return events


def test_the_cluster_gate_pauses_our_daemons_then_makes_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = held_host(tmp_path, **ON)
    events = record_pause_and_resume(monkeypatch)
    monkeypatch.setattr(protocol, "make_room", lambda config, root, layout, old, new:
                        events.append(("make_room", old, new)))
    gate = upgrade_gate.ClusterGate()
    gate.free_driver(ctx, ["pid 4242"], OLD, NEW)
    assert events == ["pause", ("make_room", OLD, NEW)]  # paused until the unload
    assert gate.freed


def test_a_cluster_gate_that_cannot_make_room_resumes_our_daemons_and_stays_shut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = held_host(tmp_path, **ON)
    events = record_pause_and_resume(monkeypatch)

    def unreachable(*args: object) -> None:
        raise ClusterApiUnavailable("could not read node gpu-1")

    monkeypatch.setattr(protocol, "make_room", unreachable)
    gate = upgrade_gate.ClusterGate()
    with pytest.raises(ClusterApiUnavailable):
        gate.free_driver(ctx, ["pid 4242"], OLD, NEW)
    assert events == ["pause", "resume"] and not gate.freed


def test_the_cluster_gate_restores_the_node_after_a_run_or_marks_it_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = held_host(tmp_path, **ON)
    events: list[object] = []
    monkeypatch.setattr(protocol, "finish", lambda config, layout: events.append("finish"))
    monkeypatch.setattr(protocol, "failed", lambda config, layout, error:
                        events.append(("failed", error.message)))
    gate = upgrade_gate.ClusterGate()
    gate.failed(ctx.config, ctx.layout, InstallFailed("boom"))
    gate.finished(ctx.config, ctx.layout)
    assert events == [("failed", "boom"), "finish"]


# --------------------------------------------------------------------------- app's run


@pytest.mark.parametrize("fails", [False, True], ids=["succeeds", "fails"])
def test_a_run_tells_the_planners_gate_how_it_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool) -> None:
    plan = plan_for(tmp_path, **ON)
    events: list[object] = []

    class Recording(upgrade_gate.RefusingGate):
        def finished(self, config: Any, layout: Layout) -> None:
            events.append("finished")

        def failed(self, config: Any, layout: Layout, error: Any) -> None:
            events.append(("failed", error.message))

    def install() -> None:
        events.append("install")
        if fails:
            raise InstallFailed("boom")

    plan.context.upgrade_gate = Recording()
    plan.steps = [Step("install", "install", lambda: False, install)]
    monkeypatch.setattr(pipeline, "run_step", lambda step: (step.apply(), step.name)[1])
    if fails:
        with pytest.raises(InstallFailed):
            app._execute(plan.context.config, plan.context.layout, plan)
        assert events == ["install", ("failed", "boom")]
    else:
        app._execute(plan.context.config, plan.context.layout, plan)
        assert events == ["install", "finished"]
