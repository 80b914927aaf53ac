"""The scheduling gate's pieces without an API server: its settings, where the planner
puts its steps, what readiness means, and the patch that gives a node the gate's state while
leaving an admin's taints and labels alone. The life cycle against the stand-in API server is
tests/cluster/test_scheduling_gate.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from lib.contexts import context
from lib.fakes import FakeRunner
from lib.hosttrees import make_host, module_line, root_env, write_driver_version, write_proc_modules

from installer import components, planner, sources
from installer.cluster import scheduling_gate, scheduling_gate_steps
from installer.components import supervisor
from installer.config import build_config, from_env
from installer.errors import ConfigError
from installer.host import readiness
from installer.hostroot import HostRoot
from installer.layout import READY_FILE

KEY = "nvidia.com/gpu.driver-not-ready"
GATE_ON = {"NVIDIA_INSTALLER_SCHEDULING_GATE": "true", "NODE_NAME": "gpu-1"}
SHIPPED = ("fabricmanager", "persistenced")  # the registered components, in order


# --------------------------------------------------------------------------- settings


def test_the_gate_is_off_by_default_with_the_documented_key() -> None:
    config = from_env({})
    assert config.scheduling_gate is False
    assert config.gate_taint == KEY and config.gate_close_after == 60


@pytest.mark.parametrize("key", [
    KEY, "startup-taint.cluster-autoscaler.kubernetes.io/nvidia-driver", "gpu-not-ready",
    "example.com/GPU_not.ready"])
def test_taint_keys_kubernetes_accepts(key: str) -> None:
    assert build_config({**GATE_ON, "NVIDIA_INSTALLER_GATE_TAINT": key}, {}).gate_taint == key


@pytest.mark.parametrize(("key", "says"), [
    ("nvidia.com/gpu", "ExtendedResourceToleration"),
    ("node.kubernetes.io/driver", "node lifecycle controller"),
    ("", "is not a taint key"),
    ("a/b/c", "is not a taint key"),
    ("Example.com/x", "is not a taint key"),
    ("example.com/-x", "is not a taint key"),
    ("example.com/" + "x" * 64, "is not a taint key"),
])
def test_taint_keys_that_cannot_gate_are_refused(key: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        build_config({**GATE_ON, "NVIDIA_INSTALLER_GATE_TAINT": key}, {})
    assert "NVIDIA_INSTALLER_GATE_TAINT" in caught.value.message


@pytest.mark.parametrize(("value", "ok"), [("0", True), ("2.5", True), ("-1", False),
                                           ("soon", False), ("inf", False), ("nan", False)])
def test_close_after_is_seconds_or_zero(value: str, ok: bool) -> None:
    env = {"NVIDIA_INSTALLER_GATE_CLOSE_AFTER": value}
    if ok:
        assert from_env(env).gate_close_after == float(value)
    else:
        with pytest.raises(ConfigError, match="NVIDIA_INSTALLER_GATE_CLOSE_AFTER"):
            from_env(env)


def test_the_gate_needs_the_node_name() -> None:
    with pytest.raises(ConfigError, match="SCHEDULING_GATE=true needs NODE_NAME"):
        build_config({"NVIDIA_INSTALLER_SCHEDULING_GATE": "true"}, {})


# --------------------------------------------------------------------------- the plan


def _names(tmp_path: Path, **env: str) -> list[str]:
    ctx = context(tmp_path, FakeRunner(), **env)
    return [step.name for step in planner._steps(ctx)]


def test_the_gate_closes_first_and_opens_last_after_verify(tmp_path: Path) -> None:
    names = _names(tmp_path, **GATE_ON)
    assert names[:2] == ["check-secure-boot", "close-scheduling-gate"]
    assert names[-1] == "open-scheduling-gate"
    assert names.index("verify-driver") < names.index("open-scheduling-gate")
    assert names.index("close-scheduling-gate") < names.index("unload-old-driver")


def test_no_gate_steps_when_off_or_when_nothing_is_loaded(tmp_path: Path) -> None:
    assert not [n for n in _names(tmp_path / "off") if "scheduling-gate" in n]
    ctx = context(tmp_path / "ahead", FakeRunner(), **GATE_ON)
    ctx.target.load = False  # building ahead for another kernel, or no GPU
    assert not [s for s in planner._steps(ctx) if "scheduling-gate" in s.name]


def test_dnf_closes_the_gate_before_its_packages_replace_a_working_driver(
        tmp_path: Path) -> None:
    ctx = context(tmp_path, FakeRunner(), **GATE_ON)
    _loaded(tmp_path, "570.195.03")
    _ready(ctx.root, "570.195.03")
    # runfile: staged first, closed at unload
    assert scheduling_gate_steps.close_step(ctx).is_satisfied()
    dnf = sources.named("dnf")  # the planner copies the source's traits into the target
    ctx.target.source = dnf.name
    ctx.target.replaces_user_space_before_unload = dnf.replaces_user_space_before_unload
    assert not scheduling_gate_steps.close_step(ctx).is_satisfied()
    _loaded(tmp_path, "580.105.08")
    _ready(ctx.root, "580.105.08")
    assert scheduling_gate_steps.close_step(ctx).is_satisfied()  # the planned driver already works


def test_the_unload_hook_does_nothing_with_the_gate_off(tmp_path: Path) -> None:
    ctx = context(tmp_path, FakeRunner())
    _ready(ctx.root, "570.195.03")
    scheduling_gate_steps.close_before_unload(ctx.config, ctx.root, "test")
    assert ctx.root.local(READY_FILE).exists()


# --------------------------------------------------------------------------- readiness


def _loaded(root: Path, version: str | None) -> None:
    names = ("nvidia_uvm", "nvidia") if version else ()
    write_proc_modules(root, [module_line(n) for n in names])
    if version:
        write_driver_version(root, version, "open")
    else:
        (root / "proc/driver/nvidia/version").unlink(missing_ok=True)


def _ready(root: HostRoot, version: str) -> None:
    root.write_atomic(READY_FILE, f"DRIVER_VERSION={version}\nKERNEL_MODULE_TYPE=open\n")


def test_readiness_is_the_verified_driver_loaded(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[0x2330])
    assert readiness.pending(root, SHIPPED) == [
        f"the driver is not verified on this boot ({READY_FILE} is absent)"]
    root.write_atomic(READY_FILE, "KERNEL_MODULE_TYPE=open\n")
    assert readiness.pending(root, SHIPPED) == [f"{READY_FILE} names no DRIVER_VERSION"]
    _ready(root, "580.105.08")
    assert readiness.pending(root, SHIPPED) == [
        "the verified driver 580.105.08 is not the one loaded (loaded: none)"]
    _loaded(tmp_path, "570.195.03")
    assert "(loaded: 570.195.03)" in readiness.pending(root, SHIPPED)[0]
    assert readiness.verified_version(root) is None
    _loaded(tmp_path, "580.105.08")
    assert readiness.driver_pending(root) == []
    assert readiness.verified_version(root) == "580.105.08"
    # The driver's part is done; the components' containers have not reported yet.
    waiting = readiness.pending(root, SHIPPED)
    assert [w.split()[0] for w in waiting] == ["fabricmanager", "persistenced"]


def test_components_that_apply_must_report_ready_for_the_driver(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[0x2330])
    _loaded(tmp_path, "580.105.08")
    _ready(root, "580.105.08")
    waiting = readiness.pending(root, SHIPPED)
    assert [w.split()[0] for w in waiting] == ["fabricmanager", "persistenced"]
    assert waiting[0].endswith("fabricmanager-ready is absent)")
    root.write_atomic(readiness.component_file("fabricmanager"),
                      "DRIVER_VERSION=580.105.08\nSTATE=not-applicable\nREASON=no NVSwitch\n")
    root.write_atomic(readiness.component_file("persistenced"),
                      "DRIVER_VERSION=570.195.03\nSTATE=running\n")
    assert readiness.pending(root, SHIPPED) == [
        "persistenced is not up for driver 580.105.08 (/run/nvidia-driver-installer/"
        "persistenced-ready names 570.195.03)"]
    root.write_atomic(readiness.component_file("persistenced"),
                      "DRIVER_VERSION=580.105.08\nSTATE=running\n")
    assert readiness.pending(root, SHIPPED) == []


def test_the_gate_waits_for_the_files_the_components_containers_write() -> None:
    assert components.names() == SHIPPED
    for name in SHIPPED:
        assert supervisor.ready_file(name) == readiness.component_file(name)


def test_a_run_closes_the_gate_on_the_driver_alone(tmp_path: Path) -> None:
    """A pod restart with the driver verified and loaded: the components' containers have not
    started yet (their files went with the old pod), and that is no reason to taint."""
    ctx = context(tmp_path, FakeRunner(), **GATE_ON)
    _loaded(tmp_path, "570.195.03")
    _ready(ctx.root, "570.195.03")
    assert readiness.pending(ctx.root, SHIPPED) != []
    assert scheduling_gate_steps.close_step(ctx).is_satisfied()


# --------------------------------------------------------------------------- the patch


def _node(taints: list[dict[str, Any]] | None, labels: dict[str, str]) -> dict[str, Any]:
    node: dict[str, Any] = {"metadata": {"name": "gpu-1", "resourceVersion": "42",
                                         "labels": dict(labels)}, "spec": {}}
    if taints is not None:
        node["spec"]["taints"] = taints
    return node


ADMIN = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
         {"key": KEY, "effect": "NoExecute"}]  # our key with another effect: not the gate's


def test_closing_appends_the_taint_and_keeps_every_other() -> None:
    node = _node(copy.deepcopy(ADMIN), {"team": "vision"})
    patch = scheduling_gate._patch(node, KEY, tainted=True, label=scheduling_gate._KEEP)
    assert patch == {"spec": {"taints": [*ADMIN, {"key": KEY, "effect": "NoSchedule"}]},
                     "metadata": {"resourceVersion": "42"}}
    closed = _node([{"key": KEY, "value": "true", "effect": "NoSchedule"}], {})
    assert scheduling_gate._patch(closed, KEY, tainted=True, label=scheduling_gate._KEEP) is None


def test_opening_takes_out_only_the_gates_taint_and_sets_the_label() -> None:
    node = _node([ADMIN[0], {"key": KEY, "value": "true", "effect": "NoSchedule"}, ADMIN[1]],
                 {"team": "vision"})
    patch = scheduling_gate._patch(node, KEY, tainted=False, label="580.105.08")
    assert patch == {"spec": {"taints": ADMIN},
                     "metadata": {"labels": {scheduling_gate.VERSION_LABEL: "580.105.08"},
                                  "resourceVersion": "42"}}
    last = _node([{"key": KEY, "effect": "NoSchedule"}],
                 {scheduling_gate.VERSION_LABEL: "580.105.08"})
    assert scheduling_gate._patch(last, KEY, tainted=False, label="580.105.08") == {
        "spec": {"taints": None}, "metadata": {"resourceVersion": "42"}}
    opened = _node(None, {scheduling_gate.VERSION_LABEL: "580.105.08"})
    assert scheduling_gate._patch(opened, KEY, tainted=False, label="580.105.08") is None


def test_uninstall_drops_the_label() -> None:
    node = _node(None, {scheduling_gate.VERSION_LABEL: "580.105.08", "team": "vision"})
    assert scheduling_gate._patch(node, KEY, tainted=True, label=None) == {
        "spec": {"taints": [{"key": KEY, "effect": "NoSchedule"}]},
        "metadata": {"labels": {scheduling_gate.VERSION_LABEL: None}, "resourceVersion": "42"}}


def test_an_upgrade_gate_config_is_valid_with_the_protocol(tmp_path: Path) -> None:
    config = from_env(root_env(tmp_path, NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true", **GATE_ON))
    assert config.scheduling_gate and config.upgrade_protocol
