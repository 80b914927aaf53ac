"""The scheduling gate's life cycle with the installer's own code against the session's real
kube-apiserver (tests/lib/controlplane.py), through the shipped RBAC and admission policy of
components/scheduling-gate (with components/upgrade-protocol's for `both`) and a token bound to
a Pod on the test's Node, by way of the fault-injecting proxy (tests/lib/apiproxy.py) that
records every request: a tainted node stays tainted through a run until verify passes; a
failing verify leaves it tainted; an upgrade puts the taint back before the unload and takes it
off after; uninstall puts it back and drops the version label; another node is denied; the
taints the server, the pool and an administrator put on and their labels are never touched; an
administrator's write between the gate's read and its write is the server's own 409, after
which the gate reads again; 429 and 500 (injected) leave the node as it was.

The driver's life cycle is followed with the driver's part of readiness alone; tests asking
for `shipped_components` follow the components' containers (Fabric Manager on NVSwitch nodes,
persistenced) as they ship. The run's steps are the installer's own (scheduling_gate_steps,
the unload step, verify's step, app.uninstall) on a host root; only NVML's answer is made up
here."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lib.apiproxy import ApiProxy
from lib.controlplane import ControlPlane, kubeconfig
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
from lib.realcluster import RealNodes, apply_policies, real_nodes

from installer import app, components, host, pipeline, state, steps
from installer import verify as verify_package
from installer.cluster import protocol, scheduling_gate, scheduling_gate_steps
from installer.cluster.client import NodeClient
from installer.components import fabricmanager, lifecycle, registry, supervisor
from installer.components.fabricmanager_daemon import FabricManagerDaemon
from installer.components.persistenced import PersistencedDaemon
from installer.config import Config, build_config
from installer.errors import (
    DriverInUse,
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
COMPONENTS_DIR = REPO / "daemonset" / "components"
GATE_DIR = COMPONENTS_DIR / "scheduling-gate"
PROTOCOL_DIR = COMPONENTS_DIR / "upgrade-protocol"
KEY = "nvidia.com/gpu.driver-not-ready"
GATE_TAINT = {"key": KEY, "value": "true", "effect": "NoSchedule"}  # as a node pool registers it
POOL_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
ADMIN_TAINTS = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
                {"key": KEY, "value": "maintenance", "effect": "NoExecute"}]
ADMIN_LABELS = {"team": "vision", "nvidia.com/gpu.deploy.device-plugin": "true"}
OLD, NEW = "570.195.03", "580.105.08"
KERNEL = "5.15.0-105-generic"
GPU = "0000:00:04.0"
MERGE = "application/merge-patch+json"
_tests = iter(range(1_000_000))


@dataclass
class Gate:
    """The test's Node on the real server (its token bound to a Pod there) and its host root.
    `opened` is the Node's taints as the server, the pool and the administrator left them,
    `labels` its labels: what the gate must leave as they are."""

    real: RealNodes
    proxy: ApiProxy
    root: Path
    kubeconfig: Path
    name: str
    token: str
    opened: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def cp(self) -> ControlPlane:
        return self.real.cp

    def config(self, **env: str) -> Config:
        values = {"NVIDIA_INSTALLER_SCHEDULING_GATE": "true", "NODE_NAME": self.name,
                  "NVIDIA_INSTALLER_KUBECONFIG": str(self.kubeconfig),
                  "ROOT_MOUNT_DIR": str(self.root),
                  "NVIDIA_INSTALL_DIR_CONTAINER": str(self.root / "no-container-mount"),
                  "NVIDIA_INSTALLER_EVICTION_TIMEOUT": "30",
                  "NVIDIA_INSTALLER_HOLDERS_TIMEOUT": "30", **env}
        return build_config(values, {})

    def node(self, name: str | None = None) -> dict[str, Any]:
        return self.real.get_node(name or self.name)

    def admin(self, patch: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        """An administrator's merge patch, straight to the server (not through the proxy)."""
        return self.cp.request("PATCH", f"/api/v1/nodes/{name or self.name}", patch,
                               content_type=MERGE)

    def taints(self, name: str | None = None) -> list[dict[str, Any]]:
        return list(self.node(name)["spec"].get("taints") or [])

    def tainted(self) -> bool:
        return any(t["key"] == KEY and t["effect"] == "NoSchedule" for t in self.taints())

    def label(self) -> str | None:
        labels: dict[str, str] = self.node()["metadata"]["labels"]
        return labels.get(scheduling_gate.VERSION_LABEL)

    def writes(self) -> list[str]:
        """The installer's writes as the proxy passed them on (without their query)."""
        return [f"{s.method} {s.path.split('?')[0]}" for s in self.proxy.writes()]

    def requests(self) -> list[tuple[str, str]]:
        with self.proxy.lock:
            return [(s.method, s.path.split("?")[0]) for s in self.proxy.seen]

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

    def dead_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig naming a port nothing listens on, with the test's token."""
        return kubeconfig(path, "https://127.0.0.1:9", self.proxy.tls.ca_file, token=self.token)



def open_node(env: Gate, version: str | None = None) -> None:
    """The Node open (the gate's taint off), with the version label when `version`."""
    if version:
        env.admin({"metadata": {"labels": {scheduling_gate.VERSION_LABEL: version}}})
    env.labels = dict(env.node()["metadata"]["labels"])


def registered_tainted(env: Gate) -> None:
    """As the kubelet registers it with --register-with-taints (after the admin's own)."""
    env.admin({"spec": {"taints": [*env.opened, GATE_TAINT]}})
    env.labels = dict(env.node()["metadata"]["labels"])


def make_gate(cp: ControlPlane, tmp_path: Path, *component_dirs: Path) -> Iterator[Gate]:
    name = f"gate-{next(_tests)}"
    root = tmp_path / "host"
    make_host(root, kernel=KERNEL, gpus=[H100])
    with real_nodes(cp, tmp_path) as (real, proxy):
        for directory in component_dirs:
            apply_policies(cp, directory / "admission-policy.yaml")
            real.bind(directory / "rbac.yaml")
        real.wait_allowed("patch", "nodes")
        real.node(name, labels=ADMIN_LABELS)
        taints = real.get_node(name)["spec"].get("taints") or []
        opened = [*taints, POOL_TAINT, *ADMIN_TAINTS]
        cp.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": opened}},
                   content_type=MERGE)
        env = Gate(real, proxy, root, tmp_path / "kubeconfig", name, real.token(name), opened)
        proxy.kubeconfig(env.kubeconfig, env.token)
        open_node(env)
        yield env


@pytest.fixture
def shipped_components() -> None:
    """components.COMPONENTS as shipped: the gate waits for the components' containers."""


@pytest.fixture(autouse=True)
def driver_only(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's part of readiness alone, unless the test asks for `shipped_components`."""
    if "shipped_components" not in request.fixturenames:
        monkeypatch.setattr(registry, "COMPONENTS", ())


@pytest.fixture
def env(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Gate]:
    """components/scheduling-gate alone."""
    yield from make_gate(control_plane, tmp_path, GATE_DIR)


@pytest.fixture
def both(control_plane: ControlPlane, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """components/upgrade-protocol and components/scheduling-gate together."""
    monkeypatch.setattr(protocol, "POLL_SECONDS", 0.05)
    monkeypatch.setattr("installer.cluster.drain.POLL_SECONDS", 0.05)
    yield from make_gate(control_plane, tmp_path, PROTOCOL_DIR, GATE_DIR)


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
    pipeline.execute(Plan(ctx, [], [scheduling_gate_steps.close_step(ctx), *middle,
                                    steps.verify_step(ctx), scheduling_gate_steps.open_step(ctx)]))


# --------------------------------------------------------------------------- a run


def test_a_tainted_node_is_untainted_only_after_verify(env: Gate,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    registered_tainted(env)
    seen: list[bool] = []
    fake_verify(monkeypatch, env, seen=seen)
    ctx = env.context(env.config(), FakeRunner())

    run(ctx, [load_step(env, NEW)])

    assert seen == [True]  # tainted while verify ran
    assert env.taints() == env.opened  # the gate's taint gone, every other one untouched
    assert env.node()["metadata"]["labels"] == {**env.labels, scheduling_gate.VERSION_LABEL: NEW}
    assert env.writes() == [f"PATCH /api/v1/nodes/{env.name}"]  # already tainted: no close


def test_a_failing_verify_leaves_the_node_tainted(env: Gate,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    registered_tainted(env)
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
    open_node(env, version=NEW)
    seen: list[bool] = []
    fake_verify(monkeypatch, env, seen=seen)
    ctx = env.context(env.config(), FakeRunner())
    closed_first: list[bool] = []

    def install_and_load() -> None:
        closed_first.append(env.tainted())
        env.loaded(NEW)

    install = Step("install", "install and load", lambda: host.loaded_driver(ctx.root) is not None,
                   install_and_load)

    run(ctx, [install])

    assert closed_first == [True] and seen == [True]
    assert env.taints() == env.opened and env.label() == NEW
    assert env.writes() == [f"PATCH /api/v1/nodes/{env.name}"] * 2  # closed, opened


def test_a_ready_node_makes_no_write_at_the_start(env: Gate) -> None:
    """A warm run (pod restart, driver verified and loaded): the start reads nothing from the
    API; the end confirms with one read."""
    open_node(env, version=NEW)
    env.loaded(NEW)
    env.ready(NEW)
    ctx = env.context(env.config(), FakeRunner())
    assert scheduling_gate_steps.close_step(ctx).is_satisfied()
    pipeline.execute(Plan(ctx, [], [scheduling_gate_steps.close_step(ctx),
                                    scheduling_gate_steps.open_step(ctx)]))
    assert env.requests() == [("GET", f"/api/v1/nodes/{env.name}")]


def test_a_component_not_up_keeps_the_gate_closed(env: Gate, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """With components to wait for (their containers' readiness), the run's end leaves the
    taint on while one has not reported ready; the scheduling-gate container opens it."""
    caplog.set_level(logging.INFO, "installer")
    registered_tainted(env)
    monkeypatch.setattr(registry, "COMPONENTS", (fabricmanager.COMPONENT,))
    fake_verify(monkeypatch, env)
    ctx = env.context(env.config(), FakeRunner())
    run(ctx, [load_step(env, NEW)])
    assert env.tainted() and env.label() is None
    assert "fabricmanager is not up for driver 580.105.08" in caplog.text
    assert env.writes() == []


def test_api_unreachable_the_driver_is_installed_and_the_run_fails_tainted(
        env: Gate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registered_tainted(env)
    before = env.node()
    dead = env.dead_kubeconfig(tmp_path / "dead")
    fake_verify(monkeypatch, env)
    ctx = env.context(env.config(NVIDIA_INSTALLER_KUBECONFIG=str(dead)), FakeRunner())

    with pytest.raises(SchedulingGateUnavailable) as caught:
        run(ctx, [load_step(env, NEW)])

    assert caught.value.exit_code == 110 and caught.value.reference == \
        "scheduling-gate-unavailable"
    assert f"could not read node {env.name}" in caught.value.message
    assert "keeps its scheduling-gate taint" in caught.value.hint
    assert env.node() == before  # never untainted by mistake
    assert ctx.root.local(READY_FILE).exists()  # the driver itself is installed and verified


def test_close_then_open_keeps_every_other_taint(env: Gate) -> None:
    assert POOL_TAINT in env.opened  # and the server's own node.kubernetes.io/not-ready
    assert scheduling_gate.close(env.config(), "driver not installed yet")
    assert env.taints() == [*env.opened, {"key": KEY, "effect": "NoSchedule"}]
    assert not scheduling_gate.close(env.config(), "again")  # closed: nothing written
    assert scheduling_gate.open_for(env.config(), NEW)
    assert env.taints() == env.opened
    assert env.label() == NEW
    assert [(s.status, s.injected) for s in env.proxy.writes()] == [(200, False)] * 2


def test_an_admins_write_between_read_and_write_is_a_real_conflict_and_kept(env: Gate) -> None:
    maintenance = {"key": "example.com/maintenance", "effect": "NoSchedule"}
    env.proxy.before("PATCH", f"/api/v1/nodes/{env.name}$",
                     lambda: env.admin({"spec": {"taints": [*env.taints(), maintenance]}}))
    assert scheduling_gate.close(env.config(), "driver not installed yet")
    assert env.taints() == [*env.opened, maintenance, {"key": KEY, "effect": "NoSchedule"}]
    # the server's own 409 for the patch guarded by the resourceVersion read before it
    assert [(s.status, s.injected) for s in env.proxy.writes()] == [(409, False), (200, False)]


@pytest.mark.parametrize("status", [429, 500])
def test_a_failing_server_leaves_the_node_and_is_the_gates_error(env: Gate,
                                                                 status: int) -> None:
    before = env.node()
    env.proxy.fail("PATCH", f"/api/v1/nodes/{env.name}$", status, times=10,
                   retry_after="1" if status == 429 else None)
    with pytest.raises(SchedulingGateUnavailable, match="scheduling gate"):
        scheduling_gate.close(env.config(), "driver not installed yet")
    assert env.node() == before
    writes = [(s.status, s.injected) for s in env.proxy.writes()]
    assert writes == [(status, True)]  # one try: the container's loop is what retries


# --------------------------------------------------------------------------- unloads


def test_an_upgrade_taints_before_the_unload_and_untaints_after(
        env: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    open_node(env, version=OLD)
    env.loaded(OLD)
    env.ready(OLD)
    at_unload: list[tuple[bool, bool]] = []

    def rmmod(argv: Sequence[str]) -> None:
        at_unload.append((env.tainted(), HostRoot(env.root).local(READY_FILE).exists()))
        if argv[-1] == "nvidia":
            env.loaded(None)

    fake_verify(monkeypatch, env)
    ctx = env.context(env.config(), FakeRunner().on("rmmod", effect=rmmod))
    # The old driver works while B compiles.
    assert scheduling_gate_steps.close_step(ctx).is_satisfied()

    run(ctx, [steps.unload_old_step(ctx), load_step(env, NEW)])

    assert at_unload and all(state == (True, False) for state in at_unload)
    assert env.taints() == env.opened and env.label() == NEW


def test_an_upgrade_whose_taint_cannot_be_set_unloads_nothing(
        env: Gate, tmp_path: Path) -> None:
    open_node(env, version=OLD)
    env.loaded(OLD)
    env.ready(OLD)
    dead = env.dead_kubeconfig(tmp_path / "dead")
    runner = FakeRunner().on("rmmod")
    ctx = env.context(env.config(NVIDIA_INSTALLER_KUBECONFIG=str(dead)), runner)
    with pytest.raises(SchedulingGateUnavailable):
        steps.unload_old_step(ctx).apply()
    assert runner.calls == []  # no rmmod
    assert host.loaded_driver(ctx.root) is not None


def test_an_unload_that_will_be_refused_leaves_the_gate_open(env: Gate) -> None:
    """A module in use (no process named): the unload refuses, the old driver keeps working,
    so the node keeps serving too."""
    open_node(env, version=OLD)
    env.loaded(OLD)
    write_proc_modules(env.root, [module_line("nvidia_uvm", refcount=2), module_line("nvidia")])
    env.ready(OLD)
    runner = FakeRunner().on("rmmod")
    ctx = env.context(env.config(), runner)

    with pytest.raises(DriverInUse, match=r"nvidia_uvm \(refcount 2\)"):
        steps.unload_old_step(ctx).apply()
    assert env.writes() == [] and runner.calls == []
    assert ctx.root.local(READY_FILE).exists()
    assert env.taints() == env.opened


def test_an_upgrade_through_the_protocol_with_the_gate(both: Gate,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Both Components: one token, two roles, two copies of the policy: the protocol's cordon,
    labels and annotation and the gate's taint and label are all admitted by the server."""
    env = both
    open_node(env, version=OLD)
    env.loaded(OLD)
    env.ready(OLD)
    plugin = env.root / "proc" / "4242"
    (plugin / "fd").mkdir(parents=True)
    (plugin / "comm").write_text("nvidia-device-p\n")
    os.symlink("/dev/nvidia0", plugin / "fd" / "3")
    done = threading.Event()

    def plugin_leaves_once_paused() -> None:
        """The device plugin's DaemonSet: its pod goes once the node's deploy label says
        paused (read from the server, as the DaemonSet controller would)."""
        while not done.wait(0.05):
            labels = env.node()["metadata"]["labels"]
            if labels.get(f"{protocol.DEPLOY_PREFIX}device-plugin") == protocol.PAUSED:
                __import__("shutil").rmtree(plugin, True)
                return

    watcher = threading.Thread(target=plugin_leaves_once_paused, daemon=True)
    watcher.start()
    at_unload: list[tuple[bool, bool]] = []
    fake_verify(monkeypatch, env)
    config = env.config(NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true")

    def rmmod(argv: Sequence[str]) -> None:
        at_unload.append((env.tainted(), bool(env.node()["spec"].get("unschedulable"))))
        if argv[-1] == "nvidia":
            env.loaded(None)

    ctx = env.context(config, FakeRunner().on("rmmod", effect=rmmod))
    try:
        run(ctx, [steps.unload_old_step(ctx), load_step(env, NEW)])
        protocol.finish(config, ctx.layout)
    finally:
        done.set()
        watcher.join(5)

    assert at_unload and all(state == (True, True) for state in at_unload)
    after = env.node()
    assert after["spec"].get("taints") == env.opened
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"][scheduling_gate.VERSION_LABEL] == NEW
    assert after["metadata"]["labels"][protocol.STATE_LABEL] == "upgrade-done"
    assert all(s.status < 400 for s in env.proxy.writes())  # nothing refused on the way


def test_uninstall_puts_the_taint_back_and_drops_the_label(
        env: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    open_node(env, version=NEW)
    env.loaded(NEW)
    env.ready(NEW)
    at_unload: list[bool] = []
    runner = FakeRunner().on("rmmod", effect=lambda argv: at_unload.append(env.tainted()))
    runner.on("depmod")
    config = env.config()
    Layout.from_config(config, HostRoot(config.root)).install_local.mkdir(parents=True)
    monkeypatch.setattr("installer.kmod.remove_nodes", lambda dev_dir: [])  # not /dev here

    app.uninstall(config, runner)

    assert at_unload and all(at_unload)
    assert env.taints() == [*env.opened, {"key": KEY, "effect": "NoSchedule"}]
    labels = dict(env.labels)
    del labels[scheduling_gate.VERSION_LABEL]
    assert env.node()["metadata"]["labels"] == labels


def test_uninstall_with_the_driver_held_changes_nothing(env: Gate) -> None:
    open_node(env, version=NEW)
    env.loaded(NEW)
    env.ready(NEW)
    holder = env.root / "proc" / "777" / "fd"
    holder.mkdir(parents=True)
    os.symlink("/dev/nvidiactl", holder / "3")
    config = env.config()
    Layout.from_config(config, HostRoot(config.root)).install_local.mkdir(parents=True)

    with pytest.raises(DriverInUse):
        app.uninstall(config, FakeRunner())
    assert env.writes() == [] and env.label() == NEW


# --------------------------------------------------------------------------- only its own node


def test_another_node_is_denied(env: Gate) -> None:
    """The token bound to the test's Node: the gate's own calls aimed at another node are
    refused by the server's policy, and the other node is unchanged."""
    other = f"{env.name}-other"
    env.real.node(other, labels={scheduling_gate.VERSION_LABEL: OLD})
    env.admin({"spec": {"taints": [*env.taints(other), GATE_TAINT]}}, other)
    before = env.node(other)
    config = env.config(NODE_NAME=other)
    with pytest.raises(SchedulingGateForbidden) as caught:
        scheduling_gate.open_for(config, NEW)
    assert caught.value.exit_code == 111
    assert f"may change only the node its pod runs on ({env.name}), not {other}" in \
        caught.value.message
    with pytest.raises(SchedulingGateForbidden):
        scheduling_gate.close(config, "test", drop_label=True)
    assert env.node(other) == before
    assert [s.status for s in env.proxy.writes()] == [403, 403]


def test_the_gate_token_may_not_change_an_admins_taint(env: Gate) -> None:
    """Cordon, other labels and other taints added or removed are refused to the gate's role
    in test_policies_real.py; here the installer's own client changing an administrator's
    taint in place (its value) is refused too, and the taints stay as they were."""
    own = NodeClient(env.name, str(env.kubeconfig))
    changed = [dict(t, value="web") if t["key"] == "dedicated" else t for t in env.opened]
    with pytest.raises(Exception, match="may not add, change or remove taints other than"):
        own.patch_node({"spec": {"taints": changed}})
    assert env.taints() == env.opened


def test_a_key_the_policy_does_not_name_is_forbidden_with_a_hint(env: Gate) -> None:
    with pytest.raises(SchedulingGateForbidden) as caught:
        scheduling_gate.close(
            env.config(NVIDIA_INSTALLER_GATE_TAINT="example.com/gpu-not-ready"), "x")
    assert "gateTaintKey" in caught.value.hint
    assert env.taints() == env.opened


def test_an_unknown_node_name(env: Gate) -> None:
    with pytest.raises(NodeNotFound):
        scheduling_gate.close(env.config(NODE_NAME=f"{env.name}-no-such-node"), "x")
    assert env.writes() == []


@contextlib.contextmanager
def another_account(env: Gate, rbac: Path | None) -> Iterator[Config]:
    """A second installer account (its name matches the policies) with `rbac` alone bound (or
    nothing), its token bound to a Pod on the test's Node: the gate's settings for it."""
    real = RealNodes(env.cp, f"{env.real.account[:-len('-nvidia-driver-installer')]}"
                             f"-x-nvidia-driver-installer")
    env.cp.service_account(real.namespace, real.account)
    try:
        if rbac is not None:
            real.bind(rbac)
            real.wait_allowed("patch", "nodes")
        path = env.proxy.kubeconfig(env.kubeconfig.with_name("another"), real.token(env.name))
        yield env.config(NVIDIA_INSTALLER_KUBECONFIG=str(path))
    finally:
        real.nodes.clear()  # the test's Node is the fixture's to remove
        real.close()


def test_the_protocols_role_alone_may_not_touch_the_gate(env: Gate) -> None:
    """components/upgrade-protocol without components/scheduling-gate: its role may patch
    nodes, but the policy admits the gate's taint and label only with the gate's role."""
    apply_policies(env.cp, PROTOCOL_DIR / "admission-policy.yaml")
    registered_tainted(env)
    before = env.node()
    protocol_only = another_account(env, PROTOCOL_DIR / "rbac.yaml")
    with protocol_only as config, pytest.raises(SchedulingGateForbidden) as caught:
        scheduling_gate.open_for(config, NEW)
    assert "without the scheduling gate's role (components/scheduling-gate)" in \
        caught.value.message
    assert env.node() == before
    assert [s.status for s in env.proxy.writes()] == [403]


def test_an_account_with_no_role_bound_changes_nothing(env: Gate) -> None:
    registered_tainted(env)
    before = env.node()
    nothing_bound = another_account(env, None)
    with nothing_bound as config, pytest.raises(SchedulingGateForbidden) as caught:
        scheduling_gate.open_for(config, NEW)
    assert caught.value.exit_code == 111
    assert env.node() == before
    assert env.writes() == []  # RBAC refused the read already


# --------------------------------------------------------------------------- installer gate


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def serving(env: Gate, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """`installer gate`'s loop in a thread (short polls); stopped at the end of the test."""
    monkeypatch.setattr(scheduling_gate, "POLL_SECONDS", 0.02)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def start(**settings: str) -> None:
        def loop() -> None:
            try:
                scheduling_gate.serve(env.config(**settings), components.names(), stop)
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
    registered_tainted(env)
    monkeypatch.setattr(registry, "COMPONENTS", (fabricmanager.COMPONENT,))
    env.loaded(NEW)
    env.ready(NEW)
    serving(NVIDIA_INSTALLER_GATE_CLOSE_AFTER="0.3")
    time.sleep(0.2)
    assert env.tainted()  # the driver alone is not enough: Fabric Manager is not up

    fm = HostRoot(env.root).local(readiness.component_file("fabricmanager"))
    fm.write_text(f"DRIVER_VERSION={NEW}\nSTATE=running\n")
    wait_for(lambda: not env.tainted())
    assert env.label() == NEW and env.taints() == env.opened

    fm.unlink()  # nv-fabricmanager died; its supervisor restarts it
    time.sleep(0.1)
    assert not env.tainted()  # a short outage is no reason to close
    wait_for(env.tainted)  # down longer than NVIDIA_INSTALLER_GATE_CLOSE_AFTER
    assert env.label() == NEW  # the driver is still the installed one

    fm.write_text(f"DRIVER_VERSION={NEW}\nSTATE=running\n")
    wait_for(lambda: not env.tainted())


def test_the_gate_container_never_closes_with_close_after_zero(
        env: Gate, serving: Callable[..., None]) -> None:
    open_node(env, version=NEW)
    env.loaded(NEW)
    env.ready(NEW)
    serving(NVIDIA_INSTALLER_GATE_CLOSE_AFTER="0")
    wait_for(lambda: len(env.requests()) >= 1)
    HostRoot(env.root).local(READY_FILE).unlink()
    time.sleep(0.4)
    assert not env.tainted() and env.writes() == []


def test_the_gate_container_rides_out_an_unreachable_api(
        env: Gate, serving: Callable[..., None], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    registered_tainted(env)
    env.loaded(NEW)
    env.ready(NEW)
    flaky = env.dead_kubeconfig(tmp_path / "flaky")
    serving(NVIDIA_INSTALLER_KUBECONFIG=str(flaky))
    wait_for(lambda: "retrying in" in caplog.text)
    assert env.tainted()
    env.proxy.kubeconfig(flaky, env.token)  # the API server is back
    wait_for(lambda: not env.tainted())


def test_the_gate_container_retries_after_429_and_500(
        env: Gate, serving: Callable[..., None], caplog: pytest.LogCaptureFixture) -> None:
    registered_tainted(env)
    env.loaded(NEW)
    env.ready(NEW)
    env.proxy.fail("PATCH", f"/api/v1/nodes/{env.name}$", 429, times=1, retry_after="1")
    env.proxy.fail("PATCH", f"/api/v1/nodes/{env.name}$", 500, times=1)
    serving()
    wait_for(lambda: not env.tainted())
    assert [(s.status, s.injected) for s in env.proxy.writes()] == [
        (429, True), (500, True), (200, False)]
    assert env.taints() == env.opened and env.label() == NEW
    assert "retrying in" in caplog.text


def run_gate_command(env: Gate, **settings: str) -> subprocess.Popen[str]:
    variables = {**os.environ, "PYTHONPATH": str(REPO), "NVIDIA_INSTALLER_SCHEDULING_GATE": "true",
                 "NODE_NAME": env.name, "NVIDIA_INSTALLER_KUBECONFIG": str(env.kubeconfig),
                 "ROOT_MOUNT_DIR": str(env.root), **settings}
    return subprocess.Popen([sys.executable, "-m", "installer", "gate"], env=variables,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_installer_gate_opens_and_leaves_the_node_open_on_sigterm(env: Gate) -> None:
    registered_tainted(env)
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
    env.admin({"spec": {"taints": [*env.opened, {"key": "example.com/gpu-not-ready",
                                                 "effect": "NoSchedule"}]}})
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
    registered_tainted(env)
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
    assert env.label() == NEW and env.taints() == env.opened


def test_elsewhere_the_idle_fabric_manager_container_lets_the_gate_open(
        env: Gate, serving: Callable[..., None], shipped_components: None) -> None:
    registered_tainted(env)
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
    registered_tainted(env)
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
    open_node(env, version=OLD)
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
    scheduling_gate_steps.open_step(env.context(env.config(), FakeRunner())).apply()
    assert env.taints() == env.opened and env.label() == NEW
