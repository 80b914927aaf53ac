"""The components registration (components.COMPONENTS): a component registered there is asked
for its decision and steps (beside the user space, and after the driver is loaded) by the
planner, for its downloads by prune, for its verify section and problems by `installer verify`,
and its daemon is one of ours (stopped before an unload); nothing else names it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from lib.cli import invoke as cli_invoke
from lib.contexts import V, our_process
from lib.fakes import FakeRunner
from lib.hosttrees import (
    H100,
    add_process,
    load_driver,
    make_host,
    root_env,
)

from installer import components, planner, steps
from installer.components import (
    fabric,
    fabricmanager,
    gpudirect,
    imex,
    imexd,
    nvlink5,
    nvlsm,
    persistenced,
    registry,
)
from installer.components.component import Part
from installer.components.supervisor import PAUSE_FILE, Daemon, ready_file
from installer.config import Config, from_env
from installer.host import readiness
from installer.hostroot import HostRoot
from installer.layout import READY_FILE, Layout
from installer.plan import Context, Decision, Plan, Step
from installer.verify import GpuInfo


class Extra(Part):
    """A component the project does not have: it records what it was asked."""

    name = "extra"
    command = True
    daemon = "nv-extra"
    awaited = True
    summary = "Keep nv-extra up beside the verified driver."

    def __init__(self) -> None:
        self.asked: list[str] = []

    def decision(self, ctx: Context) -> Decision:
        self.asked.append("decision")
        return Decision("extra", "on", f"asked for {ctx.target.version}")

    def steps(self, ctx: Context) -> list[Step]:
        self.asked.append("steps")
        return [Step("install-extra", "extra beside the user space", lambda: True, lambda: None)]

    def keeps_download(self, name: str, version: str, arch: str) -> bool:
        return name == f"extra-{arch}-{version}.tar"

    def supervised(self, config: Config, root: HostRoot) -> Daemon:
        raise AssertionError("not asked here")


@pytest.fixture
def extra(monkeypatch: pytest.MonkeyPatch) -> Extra:
    added = Extra()
    monkeypatch.setattr(registry, "COMPONENTS", (*components.COMPONENTS, added))
    return added


def plan_for(tmp_path: Path) -> Plan:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", gpus=[H100])
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=V))
    return planner.make_plan(config, FakeRunner(), fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)


def test_the_registered_components_in_plan_order() -> None:
    assert components.COMPONENTS == (gpudirect.COMPONENT, nvlink5.COMPONENT, nvlsm.COMPONENT,
                                     imex.COMPONENT, fabricmanager.COMPONENT,
                                     persistenced.COMPONENT, imexd.COMPONENT)
    # Their commands; what the scheduling gate waits for (IMEX is opt-in: reported, not
    # waited for).
    assert components.commands() == ("fabricmanager", "persistenced", "imex")
    assert components.names() == ("fabricmanager", "persistenced")
    assert components.optional() == ("imex",)
    # NVLSM runs in the fabricmanager container beside nv-fabricmanager, and stops after it.
    assert components.daemons() == ("nv-fabricmanager", "nvidia-persistenced", "nvidia-imex",
                                    "nvlsm")
    assert components.named("persistenced") is persistenced.COMPONENT
    with pytest.raises(KeyError):
        components.named("dcgm")
    with pytest.raises(KeyError):  # registered, but no container command of its own
        components.named("nvlsm")


def test_fabric_reasons_come_in_stop_order_then_the_partitions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fabric Manager's reasons, then NVLink5's (NVLSM's, which runs behind it), then the
    # fabric's own (a shared-NVSwitch partition).
    for component, said in ((fabricmanager.COMPONENT, "fm"), (nvlink5.COMPONENT, "nvlsm")):
        monkeypatch.setattr(type(component), "fabric_reasons",
                            lambda self, root, gpus, said=said: [said])
    monkeypatch.setattr(fabric, "partition_reasons", lambda root, gpus: ["partition"])
    assert components.fabric_diagnosis(HostRoot(tmp_path), ()) == ["fm", "nvlsm", "partition"]


def test_the_plan_says_and_does_the_components_in_their_order(tmp_path: Path) -> None:
    plan = plan_for(tmp_path)
    topics = [d.topic for d in plan.decisions]
    at = topics.index("gpudirect-rdma")
    assert topics[at:] == ["gpudirect-rdma", "nvlink5", "imex", "fabric-manager", "persistenced",
                           "imex-daemon"]


class Posed(Part):
    """A component with only some parts: a step beside the user space and one after the driver
    is loaded, a fabric reason, a verify section and problem; no daemon, no command."""

    name = "posed"

    def steps(self, ctx: Context) -> list[Step]:
        return [Step("install-posed", "posed", lambda: True, lambda: None)]

    def loaded_steps(self, ctx: Context) -> list[Step]:
        return [Step("load-posed", "posed after the driver", lambda: True, lambda: None)]

    def fabric_reasons(self, root: HostRoot, gpus: Sequence[GpuInfo]) -> list[str]:
        return ["posed says no"]

    def verify_section(self, config: Config, root: HostRoot) -> dict[str, object]:
        return {"posed": {"ok": False}}

    def verify_problems(self, config: Config, root: HostRoot) -> list[str]:
        return ["posed is not up"]


class Behind(Part):
    """A command-less daemon run behind another's (as NVLSM is): stopped after the others."""

    name = "behind"
    daemon = "nv-behind"
    stop_order = 1


def test_a_new_component_is_one_line_in_components(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from installer import app, verify
    from installer.verify.report import VerifyReport

    # Appended, with no other change: everything the registry says follows from its fields.
    monkeypatch.setattr(registry, "COMPONENTS", (*components.COMPONENTS, Behind(), Posed()))
    assert components.daemons() == ("nv-fabricmanager", "nvidia-persistenced", "nvidia-imex",
                                    "nvlsm", "nv-behind")
    assert components.commands() == ("fabricmanager", "persistenced", "imex")
    assert components.names() == ("fabricmanager", "persistenced")
    with pytest.raises(KeyError):
        components.named("posed")
    plan = plan_for(tmp_path)
    root = HostRoot(tmp_path)
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=V))
    assert components.fabric_diagnosis(root, ())[-1:] == ["posed says no"]
    # `installer verify` adds its section and counts its problem after the driver's own.
    answered = VerifyReport(expected_version=V, expected_gpus=(), nvml_driver_version=V,
                            smi_driver_version=V, gpus=(), problems=("the driver's own",))
    monkeypatch.setattr(verify, "verify", lambda **kwargs: answered)
    report = app.verify_installed(config)
    assert report.to_json()["posed"] == {"ok": False}
    assert report.problems == ("the driver's own", "posed is not up")
    names = [s.name for s in plan.steps]
    at = names.index("install-posed")
    assert names[at - 1:at + 2] == ["install-userspace", "install-posed", "check-driver-free"]
    # After the driver's modules, before its device nodes.
    at = names.index("load-posed")
    assert names[at - 1:at + 2] == ["load-modules", "load-posed", "create-device-nodes"]
    assert "posed" not in [d.topic for d in plan.decisions]  # it said nothing


def test_a_registered_component_is_asked_for_its_decision_and_steps(
        tmp_path: Path, extra: Extra) -> None:
    plan = plan_for(tmp_path)
    assert extra.asked == ["decision", "steps"]
    topics = [d.topic for d in plan.decisions]
    assert topics[-4:] == ["fabric-manager", "persistenced", "imex-daemon", "extra"]
    assert plan.decisions[-1] == Decision("extra", "on", f"asked for {V}")
    names = [s.name for s in plan.steps]
    # Beside the user space in versions/<ver>/, before it is activated.
    at = names.index("install-extra")
    assert names[at - 1:at + 2] == ["install-userspace", "install-extra", "check-driver-free"]


def test_prune_keeps_a_registered_components_download(tmp_path: Path, extra: Extra) -> None:
    from lib.contexts import context

    ctx = context(tmp_path, FakeRunner())
    downloads = ctx.layout.downloads
    downloads.mkdir(parents=True)
    arch = ctx.facts.arch
    keep = [f"extra-{arch}-{V}.tar", f"NVIDIA-Linux-{arch}-{V}.run"]
    drop = [f"extra-{arch}-550.127.05.tar"]
    for name in keep + drop:
        (downloads / name).write_text("x")
    steps.prune_step(ctx).apply()
    assert sorted(p.name for p in downloads.iterdir()) == sorted(keep)


def test_a_registered_components_daemon_is_ours_and_paused(tmp_path: Path, extra: Extra) -> None:
    root = make_host(tmp_path, gpus=[H100])
    config = from_env(root_env(tmp_path))
    layout = Layout.from_config(config, root)
    our_process(tmp_path, 100, str(layout.install_host), "nv-extra")
    add_process(tmp_path, 103, "python3", {5: "/dev/nvidia0"})
    assert components.our_daemons(root, layout, config) == {100}
    assert components.holders(root, layout, config) == [
        "pid 103 (python3) holds /dev/nvidia0"]
    root.write_atomic(ready_file("extra"), f"DRIVER_VERSION={V}\n")
    with components.paused(root, layout, config):
        assert root.local(PAUSE_FILE).exists()
        assert not root.local(ready_file("extra")).exists()  # not ready while stopped


def test_a_registered_component_has_its_command_and_the_gate_waits_for_it(
        tmp_path: Path, extra: Extra, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    served: list[tuple[str, str]] = []
    monkeypatch.setattr(components, "serve", lambda name, config: served.append(
        (name, str(config.root))))

    def invoke(*args: str) -> int:
        return cli_invoke(monkeypatch, list(args), root_env(tmp_path))

    assert invoke("--help") == 0
    listed = capsys.readouterr().out
    assert "  extra " in listed and "  persistenced " in listed and "  run " in listed
    assert invoke("extra", "--help") == 0
    assert Extra.summary in capsys.readouterr().out
    assert invoke("extra") == 0
    assert served == [("extra", str(tmp_path))]
    assert invoke("dcgm") == 2  # not registered: click's "No such command"

    root = make_host(tmp_path, gpus=[H100])
    load_driver(tmp_path, V, "open")
    root.write_atomic(readiness.component_file("fabricmanager"), f"DRIVER_VERSION={V}\n")
    root.write_atomic(readiness.component_file("persistenced"), f"DRIVER_VERSION={V}\n")
    root.write_atomic(READY_FILE, f"DRIVER_VERSION={V}\n")
    assert readiness.pending(root, components.names()) == [
        f"extra is not up for driver {V} ({readiness.component_file('extra')} is absent)"]
