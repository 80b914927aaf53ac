"""The scheduling gate's life cycle with the installer's API client against the
stand-in API server, which enforces the shipped RBAC and admission policies of the Components
applied (components/scheduling-gate alone, or with components/upgrade-protocol) for a token
bound to NODE: a tainted node stays tainted through a run until verify passes; a failing verify
leaves it tainted; an upgrade puts the taint back before the unload and takes it off after;
uninstall puts it back and drops the version label; another node is denied; an admin's taints
and labels are never touched. The driver's life cycle is followed with the driver's part of
readiness alone; tests asking for `shipped_components` follow the components' containers
(Fabric Manager on NVSwitch nodes, persistenced) as they ship. The run's steps are the
installer's own (gate_steps, the unload step, verify's step, app.uninstall) on a host root;
only NVML's answer is made up here."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

pytest.importorskip("celpy", reason="pip install cel-python")

from lib.fakes import FakeRunner
from lib.hosttrees import (
    CLASS_BRIDGE,
    H100,
    L4,
    add_pci_device,
    make_host,
    module_line,
    write_driver_version,
    write_proc_modules,
)

from cluster.admission import load_policies
from cluster.apiserver import ApiServer, Cluster, cluster_role_rules, write_kubeconfig
from cluster.nodes import POLICY as PROTOCOL_POLICY
from cluster.nodes import RBAC as PROTOCOL_RBAC
from cluster.nodes import NodeHost
from installer import app, components, host, pipeline, state, steps
from installer import verify as verify_package
from installer.cluster import gate, gate_steps, protocol
from installer.components import fabricmanager, lifecycle, registry, supervisor
from installer.components.fabricmanager_daemon import FabricManagerDaemon
from installer.components.persistenced import PersistencedDaemon
from installer.config import Config
from installer.errors import (
    FabricManagerMissing,
    NodeNotFound,
    SchedulingGateForbidden,
    SchedulingGateUnavailable,
    VerificationFailed,
)
from installer.host import readiness
from installer.hostroot import HostRoot
from installer.layout import GPUS_READY_FILE, READY_FILE, Layout
from installer.plan import Context, Plan, Step, Target
from installer.verify.report import VerifyReport

REPO = Path(__file__).resolve().parents[2]
GATE_DIR = REPO / "daemonset" / "components" / "scheduling-gate"
GATE_RBAC = GATE_DIR / "rbac.yaml"
GATE_POLICY = GATE_DIR / "admission-policy.yaml"
NODE, OTHER = "gpu-node-1", "gpu-node-2"
KEY = "nvidia.com/gpu.driver-not-ready"
GATE_TAINT = {"key": KEY, "value": "true", "effect": "NoSchedule"}  # as a node pool registers it
ADMIN_TAINTS = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
                {"key": KEY, "value": "maintenance", "effect": "NoExecute"}]
ADMIN_LABELS = {"kubernetes.io/hostname": NODE, "team": "vision"}
OLD, NEW = "570.195.03", "580.105.08"
KERNEL = "5.15.0-105-generic"
GPU = "0000:00:04.0"


def roles(*components: str) -> tuple[list[dict], list[tuple[dict, str]]]:
    files = {"gate": (GATE_RBAC, GATE_POLICY), "protocol": (PROTOCOL_RBAC, PROTOCOL_POLICY)}
    rbac = [files[c][0] for c in components]
    policies = [p for c in components for p in load_policies(files[c][1])]
    return cluster_role_rules(*rbac), policies


@dataclass
class Gate(NodeHost):
    switch: ClassVar[str] = "NVIDIA_INSTALLER_SCHEDULING_GATE"

    def taints(self, name: str = NODE) -> list[dict]:
        return list(self.node(name)["spec"].get("taints") or [])

    def tainted(self) -> bool:
        return any(t["key"] == KEY and t["effect"] == "NoSchedule" for t in self.taints())

    def label(self) -> str | None:
        return self.node()["metadata"]["labels"].get(gate.VERSION_LABEL)

    def writes(self) -> list[str]:
        return [f"{r.method} {r.path}" for r in self.cluster.writes()]

    def loaded(self, version: str | None) -> None:
        """The NVIDIA modules loaded at `version` (None: unloaded)."""
        names = ("nvidia_uvm", "nvidia_modeset", "nvidia") if version else ()
        write_proc_modules(self.root, [module_line(n) for n in names])
        driver = self.root / "proc/driver/nvidia/version"
        if version:
            write_driver_version(self.root, version)
        else:
            driver.unlink(missing_ok=True)

    def ready(self, version: str) -> None:
        """What verify leaves when it passed for `version`."""
        path = HostRoot(self.root).local(READY_FILE)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(state.ready_text(version, "open", "/var/lib/nvidia", KERNEL))

    def component_up(self, name: str, version: str, state: str = "running") -> None:
        """What the component's container writes once its daemon is up for `version` (or, with
        nothing to do on this node, `not-applicable`)."""
        HostRoot(self.root).write_atomic(readiness.component_file(name),
                                         f"DRIVER_VERSION={version}\nSTATE={state}\n")

    def context(self, config: Config, runner: FakeRunner, version: str = NEW,
                source: str = "runfile") -> Context:
        root = HostRoot(config.root)
        layout = Layout.from_config(config, root)
        layout.install_local.mkdir(parents=True, exist_ok=True)
        facts = host.gather(root, free_space_path=self.root)
        target = Target(version, int(version.split(".")[0]), "open", KERNEL, source, [], None,
                        True, (GPU,))
        return Context(config, root, layout, runner, facts, target, lambda *a: Path())


def open_node(cluster: Cluster, name: str = NODE, version: str | None = None) -> dict:
    node = cluster.add_node(name, dict(ADMIN_LABELS, **(
        {gate.VERSION_LABEL: version} if version else {})))
    node["spec"]["taints"] = [dict(t) for t in ADMIN_TAINTS]
    return node


def registered_tainted(cluster: Cluster, name: str = NODE) -> dict:
    """A node as the kubelet registers it with --register-with-taints (and an admin's own)."""
    node = open_node(cluster, name)
    node["spec"]["taints"].append(dict(GATE_TAINT))
    return node


def make_gate(tmp_path: Path, *components: str) -> Iterator[Gate]:
    rules, policies = roles(*components)
    cluster = Cluster(rules=rules, policies=policies, token_node=NODE)
    root = tmp_path / "host"
    make_host(root, kernel=KERNEL, gpus=[H100])
    with ApiServer(cluster) as server:
        yield Gate(cluster, server, root, server.kubeconfig(tmp_path))


@pytest.fixture
def shipped_components() -> None:
    """components.COMPONENTS as shipped: the gate waits for the components' containers."""


@pytest.fixture(autouse=True)
def driver_only(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's part of readiness alone, unless the test asks for `shipped_components`."""
    if "shipped_components" not in request.fixturenames:
        monkeypatch.setattr(registry, "COMPONENTS", ())


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Gate]:
    """components/scheduling-gate alone."""
    yield from make_gate(tmp_path, "gate")


@pytest.fixture
def both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """components/upgrade-protocol and components/scheduling-gate together."""
    monkeypatch.setattr(protocol, "POLL_SECONDS", 0.05)
    monkeypatch.setattr("installer.cluster.drain.POLL_SECONDS", 0.05)
    yield from make_gate(tmp_path, "protocol", "gate")


def fake_verify(monkeypatch: pytest.MonkeyPatch, env: Gate, problems: Sequence[str] = (),
                seen: list[bool] | None = None) -> None:
    """NVML's answer (the one thing made up here); `seen` records whether the node was tainted
    while verification ran."""

    def verify(*, install_dir: Path, expected_version: str, expected_gpus: list[str],
               runner: object, fabric_starts_later: bool = False) -> VerifyReport:
        if seen is not None:
            seen.append(env.tainted())
        return VerifyReport(expected_version, tuple(expected_gpus), expected_version,
                            expected_version, (), tuple(problems))

    monkeypatch.setattr(verify_package, "verify", verify)


def load_step(env: Gate, version: str) -> Step:
    """The modules of `version` get loaded (the kit's fake nvidia.ko does this in the VM)."""
    return Step("load-modules", "load", lambda: host.loaded_driver(HostRoot(env.root))
                is not None, lambda: env.loaded(version))


def run(ctx: Context, middle: list[Step]) -> None:
    """The run's gate steps where the planner puts them: first and last."""
    pipeline.execute(Plan(ctx, [], [gate_steps.close_step(ctx), *middle,
                                    steps.verify_step(ctx), gate_steps.open_step(ctx)]))


# --------------------------------------------------------------------------- a run


def test_a_tainted_node_is_untainted_only_after_verify(env: Gate,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    registered_tainted(env.cluster)
    seen: list[bool] = []
    fake_verify(monkeypatch, env, seen=seen)
    ctx = env.context(env.config(), FakeRunner())

    run(ctx, [load_step(env, NEW)])

    assert seen == [True]  # tainted while verify ran
    assert env.taints() == ADMIN_TAINTS  # the gate's taint gone, the admin's untouched
    assert env.node()["metadata"]["labels"] == {**ADMIN_LABELS, gate.VERSION_LABEL: NEW}
    assert env.writes() == [f"PATCH /api/v1/nodes/{NODE}"]  # already tainted: no close write


def test_a_failing_verify_leaves_the_node_tainted(env: Gate,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    registered_tainted(env.cluster)
    before = env.node()
    fake_verify(monkeypatch, env, problems=["NVML reports 0 GPUs, expected 1"])
    ctx = env.context(env.config(), FakeRunner())

    with pytest.raises(VerificationFailed):
        run(ctx, [load_step(env, NEW)])

    assert env.node() == before
    assert env.writes() == []
    assert not ctx.root.local(READY_FILE).exists()


def test_after_a_reboot_the_node_is_tainted_before_the_install(
        env: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubelet registers taints only when it creates the Node: after a reboot the node is
    still open (the same Node object), so the run puts the taint back first."""
    open_node(env.cluster, version=NEW)
    seen: list[bool] = []
    fake_verify(monkeypatch, env, seen=seen)
    ctx = env.context(env.config(), FakeRunner())
    closed_first: list[bool] = []
    install = Step("install", "install and load", lambda: host.loaded_driver(ctx.root) is not None,
                   lambda: closed_first.append(env.tainted()) or env.loaded(NEW))

    run(ctx, [install])

    assert closed_first == [True] and seen == [True]
    assert env.taints() == ADMIN_TAINTS and env.label() == NEW
    assert len(env.writes()) == 2  # closed, opened


def test_a_ready_node_makes_no_write_at_the_start(env: Gate,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm run (pod restart, driver verified and loaded): the start reads nothing from the
    API; the end confirms with one read."""
    open_node(env.cluster, version=NEW)
    env.loaded(NEW)
    env.ready(NEW)
    ctx = env.context(env.config(), FakeRunner())
    assert gate_steps.close_step(ctx).is_satisfied()
    pipeline.execute(Plan(ctx, [], [gate_steps.close_step(ctx), gate_steps.open_step(ctx)]))
    assert [(r.method, r.path) for r in env.cluster.requests] == [
        ("GET", f"/api/v1/nodes/{NODE}")]


def test_a_component_not_up_keeps_the_gate_closed(env: Gate, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """With components to wait for (their containers' readiness), the run's end leaves the
    taint on while one has not reported ready; the scheduling-gate container opens it."""
    caplog.set_level(logging.INFO, "installer")
    registered_tainted(env.cluster)
    monkeypatch.setattr(registry, "COMPONENTS", (fabricmanager.COMPONENT,))
    fake_verify(monkeypatch, env)
    ctx = env.context(env.config(), FakeRunner())
    run(ctx, [load_step(env, NEW)])
    assert env.tainted() and env.label() is None
    assert "fabricmanager is not up for driver 580.105.08" in caplog.text


def test_api_unreachable_the_driver_is_installed_and_the_run_fails_tainted(
        env: Gate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registered_tainted(env.cluster)
    before = env.node()
    dead = write_kubeconfig(tmp_path / "dead", "http://127.0.0.1:9", env.cluster.token)
    fake_verify(monkeypatch, env)
    ctx = env.context(env.config(NVIDIA_INSTALLER_KUBECONFIG=str(dead)), FakeRunner())

    with pytest.raises(SchedulingGateUnavailable) as caught:
        run(ctx, [load_step(env, NEW)])

    assert caught.value.exit_code == 110 and caught.value.reference == \
        "scheduling-gate-unavailable"
    assert f"could not read node {NODE}" in caught.value.message
    assert "keeps its scheduling-gate taint" in caught.value.hint
    assert env.node() == before  # never untainted by mistake
    assert ctx.root.local(READY_FILE).exists()  # the driver itself is installed and verified


# --------------------------------------------------------------------------- unloads


def test_an_upgrade_taints_before_the_unload_and_untaints_after(
        env: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    open_node(env.cluster, version=OLD)
    env.loaded(OLD)
    env.ready(OLD)
    at_unload: list[tuple[bool, bool]] = []

    def rmmod(argv: Sequence[str]) -> None:
        at_unload.append((env.tainted(), HostRoot(env.root).local(READY_FILE).exists()))
        if argv[-1] == "nvidia":
            env.loaded(None)

    fake_verify(monkeypatch, env)
    ctx = env.context(env.config(), FakeRunner().on("rmmod", effect=rmmod))
    assert gate_steps.close_step(ctx).is_satisfied()  # the old driver works while B compiles

    run(ctx, [steps.unload_old_step(ctx), load_step(env, NEW)])

    assert at_unload and all(state == (True, False) for state in at_unload)
    assert env.taints() == ADMIN_TAINTS and env.label() == NEW


def test_an_upgrade_whose_taint_cannot_be_set_unloads_nothing(
        env: Gate, tmp_path: Path) -> None:
    open_node(env.cluster, version=OLD)
    env.loaded(OLD)
    env.ready(OLD)
    dead = write_kubeconfig(tmp_path / "dead", "http://127.0.0.1:9", env.cluster.token)
    runner = FakeRunner().on("rmmod")
    ctx = env.context(env.config(NVIDIA_INSTALLER_KUBECONFIG=str(dead)), runner)
    with pytest.raises(SchedulingGateUnavailable):
        steps.unload_old_step(ctx).apply()
    assert runner.calls == []  # no rmmod
    assert host.loaded_driver(ctx.root) is not None


def test_an_unload_that_will_be_refused_leaves_the_gate_open(env: Gate) -> None:
    """A module in use (no process named): the unload refuses, the old driver keeps working,
    so the node keeps serving too."""
    open_node(env.cluster, version=OLD)
    env.loaded(OLD)
    write_proc_modules(env.root, [module_line("nvidia_uvm", refcount=2), module_line("nvidia")])
    env.ready(OLD)
    runner = FakeRunner().on("rmmod")
    ctx = env.context(env.config(), runner)
    from installer.errors import DriverInUse

    with pytest.raises(DriverInUse, match=r"nvidia_uvm \(refcount 2\)"):
        steps.unload_old_step(ctx).apply()
    assert env.writes() == [] and runner.calls == []
    assert ctx.root.local(READY_FILE).exists()


def test_an_upgrade_through_the_protocol_with_the_gate(both: Gate,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Both Components: one token, two roles, two copies of the policy: the protocol's cordon,
    labels and annotation and the gate's taint and label are all admitted."""
    env = both
    open_node(env.cluster, version=OLD)
    env.loaded(OLD)
    env.ready(OLD)
    plugin = env.root / "proc" / "4242"
    (plugin / "fd").mkdir(parents=True)
    (plugin / "comm").write_text("nvidia-device-p\n")
    os.symlink("/dev/nvidia0", plugin / "fd" / "3")

    def plugin_leaves(cluster: Cluster, node: dict) -> None:
        if node["metadata"]["labels"].get(f"{protocol.DEPLOY_PREFIX}device-plugin") == \
                protocol.PAUSED:
            threading.Timer(0.2, lambda: __import__("shutil").rmtree(plugin, True)).start()

    env.cluster.on_node_change.append(plugin_leaves)
    at_unload: list[tuple[bool, bool]] = []
    fake_verify(monkeypatch, env)
    config = env.config(NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true")
    def rmmod(argv: Sequence[str]) -> None:
        at_unload.append((env.tainted(), bool(env.node()["spec"].get("unschedulable"))))
        if argv[-1] == "nvidia":
            env.loaded(None)

    ctx = env.context(config, FakeRunner().on("rmmod", effect=rmmod))

    run(ctx, [steps.unload_old_step(ctx), load_step(env, NEW)])
    protocol.finish(config, ctx.layout)

    assert at_unload and all(state == (True, True) for state in at_unload)
    after = env.node()
    assert after["spec"].get("taints") == ADMIN_TAINTS
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"][gate.VERSION_LABEL] == NEW
    assert after["metadata"]["labels"][protocol.STATE_LABEL] == "upgrade-done"


def test_uninstall_puts_the_taint_back_and_drops_the_label(
        env: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    open_node(env.cluster, version=NEW)
    env.loaded(NEW)
    env.ready(NEW)
    at_unload: list[bool] = []
    runner = FakeRunner().on("rmmod", effect=lambda argv: at_unload.append(env.tainted()))
    runner.on("depmod")
    config = env.config()
    Layout.from_config(config, HostRoot(config.root)).install_local.mkdir(parents=True)
    monkeypatch.setattr("installer.modules.remove_nodes", lambda dev_dir: [])  # not /dev here

    app.uninstall(config, runner)

    assert at_unload and all(at_unload)
    assert env.taints() == [*ADMIN_TAINTS, {"key": KEY, "effect": "NoSchedule"}]
    assert env.node()["metadata"]["labels"] == ADMIN_LABELS


def test_uninstall_with_the_driver_held_changes_nothing(env: Gate,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    open_node(env.cluster, version=NEW)
    env.loaded(NEW)
    env.ready(NEW)
    holder = env.root / "proc" / "777" / "fd"
    holder.mkdir(parents=True)
    os.symlink("/dev/nvidiactl", holder / "3")
    config = env.config()
    Layout.from_config(config, HostRoot(config.root)).install_local.mkdir(parents=True)
    from installer.errors import DriverInUse

    with pytest.raises(DriverInUse):
        app.uninstall(config, FakeRunner())
    assert env.writes() == [] and env.label() == NEW


# --------------------------------------------------------------------------- only its own node


def test_another_node_is_denied(env: Gate) -> None:
    """The token bound to NODE: the gate's own calls aimed at another node are refused by the
    policy, and the other node is unchanged."""
    registered_tainted(env.cluster, OTHER)["metadata"]["labels"][gate.VERSION_LABEL] = OLD
    open_node(env.cluster, NODE)
    before = env.node(OTHER)
    config = env.config(NODE_NAME=OTHER)
    with pytest.raises(SchedulingGateForbidden) as caught:
        gate.open_for(config, NEW)
    assert caught.value.exit_code == 111
    assert f"may change only the node its pod runs on ({NODE}), not {OTHER}" in \
        caught.value.message
    with pytest.raises(SchedulingGateForbidden):
        gate.close(config, "test", drop_label=True)
    assert env.node(OTHER) == before


def test_the_gate_token_cannot_cordon_or_touch_other_taints(env: Gate) -> None:
    """Without the upgrade protocol's role its fields are refused to the same token."""
    open_node(env.cluster, NODE)
    from installer.cluster.client import NodeClient

    own = NodeClient(NODE, str(env.kubeconfig))
    with pytest.raises(Exception, match="cordon or uncordon its node only"):
        own.patch_node({"spec": {"unschedulable": True}})
    with pytest.raises(Exception, match="may not add, change or remove taints other than"):
        own.patch_node({"spec": {"taints": [ADMIN_TAINTS[1]]}})  # drop the admin's NoSchedule
    with pytest.raises(Exception, match="may not change the labels"):
        own.patch_node({"metadata": {"labels": {f"{protocol.DEPLOY_PREFIX}device-plugin":
                                                protocol.PAUSED}}})
    assert env.taints() == ADMIN_TAINTS


def test_a_key_the_policy_does_not_name_is_forbidden_with_a_hint(env: Gate) -> None:
    open_node(env.cluster)
    with pytest.raises(SchedulingGateForbidden) as caught:
        gate.close(env.config(NVIDIA_INSTALLER_GATE_TAINT="example.com/gpu-not-ready"), "x")
    assert "gateTaintKey" in caught.value.hint
    assert env.taints() == ADMIN_TAINTS


def test_an_unknown_node_name(env: Gate) -> None:
    with pytest.raises(NodeNotFound):
        gate.close(env.config(NODE_NAME="no-such-node"), "x")


def test_a_concurrent_writer_gets_a_409_and_both_changes_survive(env: Gate) -> None:
    registered_tainted(env.cluster)
    original = env.cluster.get_node
    raced: list[bool] = []

    def get_then_an_admin_taints(name: str) -> dict:
        answer = original(name)
        if not raced:
            raced.append(True)
            node = env.cluster.nodes[name]
            node["spec"]["taints"] = [*node["spec"]["taints"],
                                      {"key": "maintenance", "effect": "NoSchedule"}]
            node["metadata"]["resourceVersion"] = env.cluster.next_rv()
        return answer

    env.cluster.get_node = get_then_an_admin_taints  # type: ignore[method-assign]
    gate.open_for(env.config(), NEW)
    assert 409 in [r.status for r in env.cluster.requests if r.method == "PATCH"]
    assert env.taints() == [*ADMIN_TAINTS, {"key": "maintenance", "effect": "NoSchedule"}]


# --------------------------------------------------------------------------- installer gate


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def serving(env: Gate, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """`installer gate`'s loop in a thread (short polls); stopped at the end of the test."""
    monkeypatch.setattr(gate, "POLL_SECONDS", 0.02)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def start(**settings: str) -> None:
        def loop() -> None:
            try:
                gate.serve(env.config(**settings), components.names(), stop)
            except BaseException as error:  # handed to the test
                errors.append(error)

        threads.append(threading.Thread(target=loop, daemon=True))
        threads[-1].start()

    yield start
    stop.set()
    for thread in threads:
        thread.join(5)
    assert not errors, errors


def test_the_gate_container_opens_once_ready_and_closes_when_fabric_manager_stays_down(
        env: Gate, serving: Callable[..., None], monkeypatch: pytest.MonkeyPatch) -> None:
    registered_tainted(env.cluster)
    monkeypatch.setattr(registry, "COMPONENTS", (fabricmanager.COMPONENT,))
    env.loaded(NEW)
    env.ready(NEW)
    serving(NVIDIA_INSTALLER_GATE_CLOSE_AFTER="0.3")
    time.sleep(0.2)
    assert env.tainted()  # the driver alone is not enough: Fabric Manager is not up

    fm = HostRoot(env.root).local(readiness.component_file("fabricmanager"))
    fm.write_text(f"DRIVER_VERSION={NEW}\nSTATE=running\n")
    wait_for(lambda: not env.tainted())
    assert env.label() == NEW and env.taints() == ADMIN_TAINTS

    fm.unlink()  # nv-fabricmanager died; its supervisor restarts it
    time.sleep(0.1)
    assert not env.tainted()  # a short outage is no reason to close
    wait_for(env.tainted)  # down longer than NVIDIA_INSTALLER_GATE_CLOSE_AFTER
    assert env.label() == NEW  # the driver is still the installed one

    fm.write_text(f"DRIVER_VERSION={NEW}\nSTATE=running\n")
    wait_for(lambda: not env.tainted())


def test_the_gate_container_never_closes_with_close_after_zero(
        env: Gate, serving: Callable[..., None]) -> None:
    open_node(env.cluster, version=NEW)
    env.loaded(NEW)
    env.ready(NEW)
    serving(NVIDIA_INSTALLER_GATE_CLOSE_AFTER="0")
    wait_for(lambda: len(env.cluster.requests) >= 1)
    HostRoot(env.root).local(READY_FILE).unlink()
    time.sleep(0.4)
    assert not env.tainted() and env.writes() == []


def test_the_gate_container_rides_out_an_unreachable_api(
        env: Gate, serving: Callable[..., None], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    registered_tainted(env.cluster)
    env.loaded(NEW)
    env.ready(NEW)
    flaky = tmp_path / "flaky"
    write_kubeconfig(flaky, "http://127.0.0.1:9", env.cluster.token)
    serving(NVIDIA_INSTALLER_KUBECONFIG=str(flaky))
    wait_for(lambda: "retrying in" in caplog.text)
    assert env.tainted()
    write_kubeconfig(flaky, env.server.url, env.cluster.token)  # the API server is back
    wait_for(lambda: not env.tainted())


def run_gate_command(env: Gate, **settings: str) -> subprocess.Popen[str]:
    variables = {**os.environ, "PYTHONPATH": str(REPO), "NVIDIA_INSTALLER_SCHEDULING_GATE": "true",
                 "NODE_NAME": NODE, "NVIDIA_INSTALLER_KUBECONFIG": str(env.kubeconfig),
                 "ROOT_MOUNT_DIR": str(env.root), **settings}
    return subprocess.Popen([sys.executable, "-m", "installer", "gate"], env=variables,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_installer_gate_opens_and_leaves_the_node_open_on_sigterm(env: Gate) -> None:
    registered_tainted(env.cluster)
    env.loaded(NEW)
    env.ready(NEW)
    env.component_up("fabricmanager", NEW, "not-applicable")  # the child reads the shipped list
    env.component_up("persistenced", NEW)
    command = run_gate_command(env)
    try:
        wait_for(lambda: not env.tainted(), timeout=60)
    finally:
        command.send_signal(signal.SIGTERM)
        _, err = command.communicate(timeout=30)
    assert command.returncode == 0, err
    assert not env.tainted() and env.label() == NEW
    assert "scheduling gate opened" in err and "stopping" in err


def test_installer_gate_refused_by_the_policy_exits_with_its_reference(
        env: Gate, tmp_path: Path) -> None:
    open_node(env.cluster)
    env.cluster.nodes[NODE]["spec"]["taints"].append(
        {"key": "example.com/gpu-not-ready", "effect": "NoSchedule"})
    env.loaded(NEW)
    env.ready(NEW)
    env.component_up("fabricmanager", NEW, "not-applicable")
    env.component_up("persistenced", NEW)
    log = tmp_path / "termination-log"
    log.write_text("")
    command = run_gate_command(env, NVIDIA_INSTALLER_GATE_TAINT="example.com/gpu-not-ready",
                               NVIDIA_INSTALLER_TERMINATION_LOG=str(log))
    _, err = command.communicate(timeout=60)
    assert command.returncode == 111, err
    assert log.read_text().startswith("error[scheduling-gate-forbidden]: scheduling gate: ")


def test_installer_gate_needs_the_gate_on(env: Gate) -> None:
    command = run_gate_command(env, NVIDIA_INSTALLER_SCHEDULING_GATE="false")
    _, err = command.communicate(timeout=60)
    assert command.returncode == 10 and "needs NVIDIA_INSTALLER_SCHEDULING_GATE=true" in err


# --------------------------------------------------------------------------- the components


def _supervise(daemon: object, env: Gate) -> tuple[threading.Event, list[BaseException],
                                                    threading.Thread]:
    """A component's container: the real supervisor around `daemon`, in a thread."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            supervisor.Supervisor(daemon, HostRoot(env.root), 5, stop,  # type: ignore[arg-type]
                                  poll=0.02, components=components.names()).run()
        except BaseException as error:  # handed to the test
            errors.append(error)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return stop, errors, thread


def test_on_an_nvswitch_node_the_gate_opens_only_once_fabric_manager_is_up(
        env: Gate, serving: Callable[..., None], shipped_components: None) -> None:
    """HGX: the driver verified and persistenced up are not enough; the fabricmanager
    container that cannot run Fabric Manager (none installed for the driver) keeps the node
    tainted, and its file for the driver opens the gate."""
    for address in ("0000:05:00.0", "0000:06:00.0"):
        add_pci_device(env.root, address, device=0x22A3, klass=CLASS_BRIDGE)
    registered_tainted(env.cluster)
    env.loaded(NEW)
    env.ready(NEW)
    env.component_up("persistenced", NEW)
    fm = FabricManagerDaemon(env.config(), HostRoot(env.root))
    stop, errors, thread = _supervise(fm, env)
    try:
        serving()
        thread.join(5)
        assert [type(e) for e in errors] == [FabricManagerMissing]
        time.sleep(0.2)
        assert env.tainted() and env.label() is None
        assert "fabricmanager is not up for driver" in "; ".join(
            readiness.pending(HostRoot(env.root), components.names()))
    finally:
        stop.set()
        fm.close()
    env.component_up("fabricmanager", NEW)  # nv-fabricmanager configured the switches
    wait_for(lambda: not env.tainted())
    assert env.label() == NEW and env.taints() == ADMIN_TAINTS


def test_elsewhere_the_idle_fabric_manager_container_lets_the_gate_open(
        env: Gate, serving: Callable[..., None], shipped_components: None) -> None:
    registered_tainted(env.cluster)
    env.loaded(NEW)
    env.ready(NEW)
    # An L4 in place of the H100: no NVLink fabric to wait for (a Hopper would make the
    # container wait for NVML to report its fabric complete).
    (env.root / "sys/devices/pci0000:00/0000:10:00.0/device").write_text(f"{L4:#06x}\n")
    fm = FabricManagerDaemon(env.config(), HostRoot(env.root))
    stop, errors, thread = _supervise(fm, env)
    try:
        serving()
        wait_for(lambda: "STATE=not-applicable" in (HostRoot(env.root).read_text(
            readiness.component_file("fabricmanager")) or ""))
        time.sleep(0.2)
        assert env.tainted()  # persistenced has not reported
        gpus_ready = HostRoot(env.root).local(GPUS_READY_FILE)
        assert not gpus_ready.exists()  # the file says what the gate says
        env.component_up("persistenced", NEW)
        wait_for(lambda: not env.tainted())
        wait_for(gpus_ready.exists)
        assert gpus_ready.read_text() == f"DRIVER_VERSION={NEW}\n"
        assert env.label() == NEW and not errors
    finally:
        stop.set()
        thread.join(5)
        fm.close()


def test_with_persistence_left_to_the_host_the_gate_opens_without_our_daemon(
        env: Gate, serving: Callable[..., None], shipped_components: None) -> None:
    """NVIDIA_INSTALLER_PERSISTENCED=false (the host runs its own nvidia-persistenced): the
    persistenced container idles as not-applicable and the gate opens without it."""
    registered_tainted(env.cluster)
    env.loaded(NEW)
    env.ready(NEW)
    env.component_up("fabricmanager", NEW, "not-applicable")
    daemon = PersistencedDaemon(env.config(NVIDIA_INSTALLER_PERSISTENCED="false"),
                                HostRoot(env.root))
    serving()
    time.sleep(0.2)
    assert env.tainted()  # the persistenced container has not said anything yet
    stop, errors, thread = _supervise(daemon, env)
    try:
        wait_for(lambda: "STATE=not-applicable\nREASON=NVIDIA_INSTALLER_PERSISTENCED=false" in (
            HostRoot(env.root).read_text(readiness.component_file("persistenced")) or ""))
        wait_for(lambda: not env.tainted())
        assert env.label() == NEW and not errors
    finally:
        stop.set()
        thread.join(5)


def test_an_upgrade_closes_the_gate_then_stops_our_daemons_then_unloads(
        env: Gate, monkeypatch: pytest.MonkeyPatch, shipped_components: None) -> None:
    """Gate closed, then the daemons paused (their files gone, the pause file written), then
    the unload; the run ends with the gate closed until the containers report for the new
    driver."""
    open_node(env.cluster, version=OLD)
    env.loaded(OLD)
    env.ready(OLD)
    env.component_up("fabricmanager", OLD, "not-applicable")
    env.component_up("persistenced", OLD)
    root = HostRoot(env.root)
    assert supervisor.sync_gpus_ready(root, components.names())  # as the containers keep it
    order: list[str] = []
    pause = lifecycle.pause

    def pausing(*args: object) -> None:
        order.append(f"pause (tainted: {env.tainted()})")
        pause(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(lifecycle, "pause", pausing)

    def rmmod(argv: Sequence[str]) -> None:
        if not order or not order[-1].startswith("rmmod"):
            order.append(f"rmmod (paused: {root.local(supervisor.PAUSE_FILE).exists()}, "
                         f"persistenced-ready: "
                         f"{root.local(readiness.component_file('persistenced')).exists()}, "
                         f"gpus-ready: {root.local(GPUS_READY_FILE).exists()})")
        if argv[-1] == "nvidia":
            env.loaded(None)

    fake_verify(monkeypatch, env)
    ctx = env.context(env.config(), FakeRunner().on("rmmod", effect=rmmod))
    run(ctx, [steps.unload_old_step(ctx), load_step(env, NEW)])

    assert order == ["pause (tainted: True)",
                     "rmmod (paused: True, persistenced-ready: False, gpus-ready: False)"]
    assert not root.local(supervisor.PAUSE_FILE).exists()  # resumed after the unload
    assert env.tainted()  # verified, but the containers have not reported for NEW yet
    env.component_up("fabricmanager", NEW, "not-applicable")
    env.component_up("persistenced", NEW)
    gate_steps.open_step(env.context(env.config(), FakeRunner())).apply()
    assert env.taints() == ADMIN_TAINTS and env.label() == NEW
