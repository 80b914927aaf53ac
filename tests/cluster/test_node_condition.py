"""The NvidiaDriverReady condition and the install Events against a real kube-apiserver
(tests/lib/controlplane.py, through tests/lib/apiproxy.py), which enforces
components/cluster-signals' RBAC and admission policies as shipped for a token from the
TokenRequest API bound to a Pod on NODE: a run's outcome lands in nodes/status (merged by type
beside the kubelet's conditions, under its own field manager) and as Events on the node;
`installer gate` with the signals on keeps the condition in step with the readiness files; the
policy admits nothing else (another node, another condition, another status field, labels
through status, events about another node), and a refused event never fails anything."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lib.apiproxy import ApiProxy
from lib.controlplane import ControlPlane
from lib.hosttrees import H100, make_host, write_proc_modules, write_verified
from lib.realcluster import RealNodes, component_nodes

from installer import state
from installer.cluster import client as client_module
from installer.cluster import condition, driver_labels, events, scheduling_gate, signals
from installer.cluster.client import NodeClient
from installer.config import Config, build_config
from installer.errors import (
    ClusterApiForbidden,
    DriverInUse,
    NodeConditionForbidden,
)
from installer.host import readiness
from installer.hostroot import HostRoot
from installer.layout import READY_FILE
from installer.plan import StepOutcome, Target

REPO = Path(__file__).resolve().parents[2]
SIGNALS = REPO / "daemonset" / "components" / "cluster-signals"
NODE, OTHER = "gpu-node-1", "gpu-node-2"
VERSION, KERNEL = "580.105.08", "6.8.0-1015-gcp"
KUBELET_READY = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": "2026-11-27T03:00:00Z",
                 "lastTransitionTime": "2026-11-20T03:00:00Z"}


@dataclass
class Signals:
    real: RealNodes
    proxy: ApiProxy
    root: Path
    kubeconfig: Path

    def config(self, **env: str) -> Config:
        values = {"NVIDIA_INSTALLER_CLUSTER_SIGNALS": "true", "NODE_NAME": NODE,
                  "NVIDIA_INSTALLER_KUBECONFIG": str(self.kubeconfig),
                  "ROOT_MOUNT_DIR": str(self.root),
                  "NVIDIA_INSTALL_DIR_CONTAINER": str(self.root / "no-container-mount"), **env}
        return build_config(values, {})

    def node(self, name: str = NODE) -> dict[str, Any]:
        return self.real.get_node(name)

    def conditions(self, name: str = NODE) -> list[dict]:
        return list(self.node(name).get("status", {}).get("conditions") or [])

    def ours(self) -> dict | None:
        return condition.current(self.node())

    def event_objects(self) -> list[dict[str, Any]]:
        found = self.real.events(NODE) + self.real.events(OTHER)
        return sorted(found, key=lambda e: int(e["metadata"]["resourceVersion"]))

    def events(self) -> list[tuple[str, str, str]]:
        return [(e["type"], e["reason"], e["message"]) for e in self.event_objects()]

    def write_paths(self) -> set[str]:
        return {s.path.split("?")[0] for s in self.proxy.writes()}

    def verified(self, version: str = VERSION) -> None:
        """What a passing verify leaves: the modules loaded and the readiness file."""
        write_verified(self.root, version, KERNEL)


def seed_node(real: RealNodes, name: str) -> None:
    real.node(name, status={"conditions": [dict(KUBELET_READY)],
                            "capacity": {"nvidia.com/gpu": "8", "cpu": "96"},
                            "nodeInfo": {"kernelVersion": KERNEL},
                            # As the kubelet reports them (Kubernetes >= 1.30).
                            "runtimeHandlers": [{"name": "", "features": {
                                "recursiveReadOnlyMounts": True, "userNamespaces": False}}]})


pytestmark = pytest.mark.usefixtures("driver_readiness_only")


@pytest.fixture
def env(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Signals]:
    with component_nodes(control_plane, tmp_path, SIGNALS) as (real, proxy):
        real.wait_allowed("patch", "nodes", "status")
        seed_node(real, NODE)
        seed_node(real, OTHER)
        root = tmp_path / "host"
        make_host(root, kernel=KERNEL, gpus=[H100])
        yield Signals(real, proxy, root,
                      proxy.kubeconfig(tmp_path / "kubeconfig", real.token(NODE)))


def target(version: str = VERSION) -> Target:
    return Target(version, int(version.split(".")[0]), "open", KERNEL, "runfile", [], None, True,
                  ("0000:00:04.0",))


COLD_RUN = [StepOutcome("fetch-runfile", "applied", 12.0),
            StepOutcome("build-modules", "applied", 95.5),
            StepOutcome("install-userspace", "applied", 3.2),
            StepOutcome("load-modules", "applied", 1.1),
            StepOutcome("verify-driver", "applied", 2.4),
            StepOutcome("prepare-next-kernel", "applied", 80.0)]


# --------------------------------------------------------------------------- a run


def test_a_cold_run_says_installing_then_verified_with_its_events(env: Signals) -> None:
    told = signals.Told(env.config())
    told.started(target())
    ours = env.ours()
    assert ours is not None and (ours["status"], ours["reason"]) == ("Unknown", "Installing")
    env.verified()
    told.succeeded(COLD_RUN, VERSION, 190.0)

    conditions = env.conditions()
    # Merged by type: the kubelet's is untouched (the server puts the new one first).
    assert [c for c in conditions if c["type"] == "Ready"] == [KUBELET_READY]
    ours = env.ours()
    assert ours is not None
    assert (ours["status"], ours["reason"]) == ("True", "Verified")
    assert f"driver {VERSION} (open)" in ours["message"] and f"kernel {KERNEL}" in ours["message"]
    assert ours["lastTransitionTime"] and ours["lastHeartbeatTime"]
    managers = [e["manager"] for e in env.node()["metadata"]["managedFields"]
                if "k:{\"type\":\"NvidiaDriverReady\"}" in
                e["fieldsV1"].get("f:status", {}).get("f:conditions", {})]
    assert managers == [client_module.CONDITION_MANAGER]
    assert [(t, r) for t, r, _ in env.events()] == [
        ("Normal", "DriverInstallStarted"), ("Normal", "DriverModulesCompiled"),
        ("Normal", "DriverInstalled"), ("Normal", "DriverVerified"),
        ("Normal", "NextKernelPrepared")]
    messages = dict((r, m) for _, r, m in env.events())
    assert messages["DriverInstallStarted"] == (f"installing NVIDIA driver {VERSION} (open) for "
                                                f"kernel {KERNEL} from runfile")
    assert "compiled in 95.5 s" in messages["DriverModulesCompiled"]
    assert "installed in 190.0 s (fetch-runfile 12.0 s, build-modules 95.5 s" in \
        messages["DriverInstalled"]
    event = env.event_objects()[0]
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == NODE
    assert event["involvedObject"]["uid"] == env.node()["metadata"]["uid"]
    assert event["reportingComponent"] == "nvidia-driver-installer"
    assert event["reportingInstance"] == f"nvidia-driver-installer-{NODE}"
    assert event["action"] == "Install" and event["count"] == 1


def test_a_warm_run_writes_nothing_when_the_node_already_says_so(env: Signals) -> None:
    env.verified()
    told = signals.Told(env.config())
    told.succeeded([], VERSION, 0.1)
    first = env.ours()
    writes = len(env.proxy.writes())
    told = signals.Told(env.config())
    told.started(target())  # verified and loaded: says nothing
    told.succeeded([StepOutcome("verify-driver", "satisfied", 0.0)], VERSION, 0.2)
    assert len(env.proxy.writes()) == writes and env.ours() == first
    assert env.events() == []


def test_a_failed_run_sets_false_with_the_reference_and_a_warning_event(env: Signals) -> None:
    env.verified()
    signals.Told(env.config()).succeeded([], VERSION, 0.1)
    verified_at = env.ours()["lastTransitionTime"]  # type: ignore[index]
    error = DriverInUse("driver 570.195.03 is held by pid 4242 (nv-hostengine)")
    signals.Told(env.config()).failed(error)
    ours = env.ours()
    assert ours is not None and (ours["status"], ours["reason"]) == ("False", "DriverInUse")
    assert ours["message"].startswith(error.message) and error.hint in ours["message"]
    assert ours["lastTransitionTime"] >= verified_at
    assert env.events()[-1] == ("Warning", "DriverInstallFailed",
                                f"error[driver-in-use]: {error.message} Hint: {error.hint}")
    assert [c for c in env.conditions() if c["type"] == "Ready"] == [KUBELET_READY]


def test_last_transition_time_moves_only_with_the_status(env: Signals,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    config = env.config()
    ticks = iter(f"2026-11-27T04:0{i}:00Z" for i in range(10))
    monkeypatch.setattr(condition, "_now", lambda: next(ticks))
    condition.set_condition(config, condition.Reading("False", "DriverNotReady", "a"))
    condition.set_condition(config, condition.Reading("False", "ComponentsNotReady", "b"))
    ours = env.ours()
    assert ours is not None and ours["lastTransitionTime"] == "2026-11-27T04:00:00Z"
    assert ours["lastHeartbeatTime"] == "2026-11-27T04:01:00Z"
    condition.set_condition(config, condition.Reading("True", "Verified", "c"))
    assert env.ours()["lastTransitionTime"] == "2026-11-27T04:02:00Z"  # type: ignore[index]
    assert not condition.set_condition(config, condition.Reading("True", "Verified", "c"))


def test_the_message_names_the_fabric_the_fabricmanager_container_reported(
        tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    root.write_atomic(READY_FILE, state.ready_text(VERSION, "open", "/var/lib/nvidia", KERNEL))
    root.write_atomic(readiness.component_file("fabricmanager"),
                      f"DRIVER_VERSION={VERSION}\nSTATE=running\nPID=7\nFABRIC=completed\n")
    root.write_atomic(readiness.component_file("persistenced"),
                      f"DRIVER_VERSION={VERSION}\nSTATE=not-applicable\n")

    assert condition.facts(root, ("fabricmanager", "persistenced")) == (
        f"driver {VERSION} (open), kernel {KERNEL}, fabricmanager: up (fabric completed), "
        "persistenced: not needed")


def test_camel_case_reasons() -> None:
    assert condition.camel("driver-in-use") == "DriverInUse"
    assert condition.camel("no-nvidia-gpu") == "NoNvidiaGpu"


# --------------------------------------------------------------------------- the policy


def raw(env: Signals, node: str = NODE) -> NodeClient:
    return NodeClient(node, str(env.kubeconfig))


def test_the_condition_of_another_node_is_denied(env: Signals) -> None:
    with pytest.raises(ClusterApiForbidden, match="only the status of the node its pod runs on"):
        raw(env, OTHER).patch_status({"status": {"conditions": [
            {"type": condition.TYPE, "status": "False", "reason": "Forged"}]}})
    assert condition.current(env.node(OTHER)) is None


@pytest.mark.parametrize("patch, why", [
    ({"status": {"conditions": [dict(KUBELET_READY, status="False")]}},
     "only the NvidiaDriverReady condition"),
    ({"status": {"conditions": [{"type": "MemoryPressure", "status": "True"}]}},
     "only the NvidiaDriverReady condition"),
    ({"status": {"capacity": {"nvidia.com/gpu": "0"}}}, "no node status field"),
    ({"status": {"runtimeHandlers": [{"name": "nvidia", "features": {
        "recursiveReadOnlyMounts": True, "userNamespaces": True}}]}}, "no node status field"),
    ({"metadata": {"labels": {"team": "x"}}}, "no node metadata"),
    # The status strategy keeps what metadata a nodes/status write sends: an owner that does not
    # exist lets the garbage collector delete the Node (and with it every pod on it), and a
    # finalizer holds its deletion forever.
    ({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                                        "name": "ghost", "uid": "0b1c2d3e-0000-4000-8000-1"}]},
      "status": {"conditions": [{"type": "NvidiaDriverReady", "status": "True"}]}},
     r"no node metadata through nodes/status \(changed: ownerReferences\)"),
    ({"metadata": {"finalizers": ["example.com/hold"]}}, r"\(changed: finalizers\)"),
    ({"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}}},
     r"\(changed: annotations\)"),
    # Status fields of newer Kubernetes versions (features, declaredFeatures), which the policy
    # never names: frozen as much as the ones every version has.
    ({"status": {"features": {"supplementalGroupsPolicy": False}}},
     r"no node status field but its NvidiaDriverReady condition \(changed: features\)"),
    ({"status": {"declaredFeatures": ["InPlacePodVerticalScaling"],
                 "conditions": [{"type": "NvidiaDriverReady", "status": "True"}]}},
     r"\(changed: declaredFeatures\)"),
])
def test_anything_else_through_nodes_status_is_denied(env: Signals, patch: dict,
                                                      why: str) -> None:
    before = env.node()
    with pytest.raises(ClusterApiForbidden, match=why):
        raw(env).patch_status(patch)
    assert env.node() == before


def test_spec_through_nodes_status_is_dropped_as_the_api_server_does(env: Signals) -> None:
    raw(env).patch_status({"spec": {"unschedulable": True}, "status": {"conditions": [
        {"type": condition.TYPE, "status": "True", "reason": "Verified"}]}})
    assert "unschedulable" not in env.node()["spec"]


@pytest.mark.parametrize(("patch", "says"), [
    ({"metadata": {"labels": {"team": "x"}}}, "may not change the labels team"),
    ({"metadata": {"labels": {"nvidia.com/gpu.deploy.device-plugin": "false"}}},
     "may not change the labels nvidia.com/gpu.deploy.device-plugin"),
    ({"metadata": {"annotations": {"cloud.google.com/gke-accelerator": "x"}}},
     "may not change the annotations cloud.google.com/gke-accelerator"),
    ({"spec": {"unschedulable": True}}, "only with the upgrade protocol's role"),
    ({"metadata": {"finalizers": ["example.com/hold"]}}, "owner references or finalizers"),
])
def test_on_the_node_itself_only_the_driver_version_keys(env: Signals, patch: dict,
                                                         says: str) -> None:
    """The signals' role may patch nodes (server-side apply is a patch); the policy holds it
    to the driver version's keys on its own node."""
    before = env.node()
    with pytest.raises(ClusterApiForbidden, match=re.escape(says)):
        raw(env).patch_node(patch)
    assert env.node() == before
    with pytest.raises(ClusterApiForbidden, match=f"not {OTHER}"):
        raw(env, OTHER).apply_node({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": OTHER, "labels": {driver_labels.PRESENT: "true"}}})
    assert driver_labels.PRESENT not in env.node(OTHER)["metadata"]["labels"]


def test_a_refusal_is_node_condition_forbidden_and_a_run_only_warns(
        env: Signals, caplog: pytest.LogCaptureFixture) -> None:
    env.real.unbind()
    env.real.bind(REPO / "daemonset" / "components" / "scheduling-gate" / "rbac.yaml")
    env.real.wait_allowed("patch", "nodes", "status", allowed=False)
    reading = condition.Reading("True", "Verified", "x")
    with pytest.raises(NodeConditionForbidden) as caught:
        condition.set_condition(env.config(), reading)
    assert caught.value.exit_code == 101 and "nodes/status" in caught.value.message
    condition.report(env.config(), reading)  # a run: a warning, never an error
    assert "could not set the NvidiaDriverReady condition" in caplog.text


def test_a_server_error_or_a_silent_server_only_warns_and_the_next_write_lands(
        env: Signals, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Faults the real server will not make on cue, injected by the proxy in front of it: a 500
    on the status write, then an answer that never comes (the client's read timeout)."""
    monkeypatch.setattr(client_module, "READ_TIMEOUT", 0.5)
    status_path = f"/api/v1/nodes/{NODE}/status"
    reading = condition.Reading("True", "Verified", "x")
    env.proxy.fail("PATCH", status_path, 500)
    condition.report(env.config(), reading)
    assert env.ours() is None
    assert "could not set the NvidiaDriverReady condition of node gpu-node-1" in caplog.text
    env.proxy.fail("PATCH", status_path, 0, hang=1.0)
    condition.report(env.config(), reading)
    assert env.ours() is None
    condition.report(env.config(), reading)
    ours = env.ours()
    assert ours is not None and (ours["status"], ours["reason"]) == ("True", "Verified")
    statuses = [(s.status, s.injected) for s in env.proxy.writes()
                if s.path.split("?")[0] == status_path]
    assert statuses == [(500, True), (0, True), (200, False)]


def test_an_event_about_another_node_is_denied_and_never_raises(
        env: Signals, caplog: pytest.LogCaptureFixture) -> None:
    other = raw(env, OTHER)
    other.event(env.node(OTHER)["metadata"]["uid"], "DriverVerified", "forged")
    assert env.events() == []
    assert "may post events only about its own node" in caplog.text


def own_event(env: Signals, **change: object) -> dict:
    """The Event the installer posts about its node (client.event's body), changed."""
    body = {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{NODE}.1", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": NODE,
                               "uid": env.node()["metadata"]["uid"]},
            "reason": "DriverVerified", "message": "m", "type": "Normal",
            "source": {"component": "nvidia-driver-installer", "host": NODE},
            "reportingComponent": "nvidia-driver-installer",
            "reportingInstance": f"nvidia-driver-installer-{NODE}", "action": "Verify"}
    body.update(change)
    return body


def post(env: Signals, body: dict) -> None:
    raw(env)._call("POST", "/api/v1/namespaces/default/events", body=body, what="post")


def test_the_installers_own_event_shape_is_admitted(env: Signals) -> None:
    post(env, own_event(env))
    assert [r for _, r, _ in env.events()] == ["DriverVerified"]


@pytest.mark.parametrize("change", [
    {"reportingComponent": "kubelet"},
    {"reportingInstance": f"kubelet-{OTHER}"},
    {"source": {"component": "kubelet", "host": NODE}},
    {"source": {"component": "nvidia-driver-installer", "host": OTHER}},
    {"source": {"component": "nvidia-driver-installer"}},
    {"related": {"apiVersion": "v1", "kind": "Node", "name": OTHER}},
    {"related": {"apiVersion": "v1", "kind": "Pod", "namespace": "kube-system",
                 "name": "coredns-1"}},
    {"involvedObject": {"apiVersion": "v1", "kind": "Node", "name": NODE,
                        "uid": "6e1f6b62-0000-4000-8000-000000000000"}},
    # A Node has no namespace. (One other than the Event's own, kube-system say, the server's
    # Event validation refuses with a 422 before any policy sees it.)
    {"involvedObject": {"apiVersion": "v1", "kind": "Node", "name": NODE,
                        "namespace": "default"}},
])
def test_an_event_claiming_another_source_or_relation_is_denied(env: Signals,
                                                               change: dict) -> None:
    """A stolen token may tell something false about its own node, but not as the kubelet,
    another node's host or about another object."""
    with pytest.raises(ClusterApiForbidden, match="may post events only"):
        post(env, own_event(env, **change))
    assert env.events() == []


def test_a_lost_event_never_fails_a_run(env: Signals,
                                        caplog: pytest.LogCaptureFixture) -> None:
    config = env.config(NODE_NAME="gone")
    events.Poster(config).post([events.failed(DriverInUse("held"))])  # 404: logged only
    assert env.events() == [] and "could not post 1 event(s) on node gone" in caplog.text


def test_a_refused_run_tells_the_cluster_with_its_reference(env: Signals) -> None:
    """app.run itself: a node with no NVIDIA GPU is refused while planning, and the refusal
    reaches the node as the condition and a Warning event."""
    from lib.fakes import FakeRunner
    from lib.hosttrees import root_env

    from installer import app
    from installer.config import from_env
    from installer.errors import NoNvidiaGpu

    bare = env.root.parent / "bare"
    make_host(bare, kernel=KERNEL, gpus=[])
    config = from_env(root_env(bare, NVIDIA_INSTALL_DIR_HOST="/var/lib/nvidia",
                               NVIDIA_INSTALLER_CLUSTER_SIGNALS="true", NODE_NAME=NODE,
                               NVIDIA_INSTALLER_KUBECONFIG=str(env.kubeconfig)))
    with pytest.raises(NoNvidiaGpu):
        app.run(config, FakeRunner())
    ours = env.ours()
    assert ours is not None and (ours["status"], ours["reason"]) == ("False", "NoNvidiaGpu")
    assert [(t, r) for t, r, _ in env.events()] == [("Warning", "DriverInstallFailed")]
    assert env.events()[0][2].startswith("error[no-nvidia-gpu]: ")


# --------------------------------------------------------------------------- `installer gate`


def test_installer_gate_keeps_the_condition_and_tells_each_change(
        env: Signals, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduling_gate, "POLL_SECONDS", 0.02)
    config = env.config()
    stop = threading.Event()
    thread = threading.Thread(target=scheduling_gate.serve, args=(config, ()),
                              kwargs={"stop": stop}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: (env.ours() or {}).get("reason") == "DriverNotReady")
        env.verified()
        wait_for(lambda: (env.ours() or {}).get("status") == "True")
        # The driver unloaded by hand: the condition goes False again.
        write_proc_modules(env.root, [])
        (env.root / "proc/driver/nvidia/version").unlink()
        wait_for(lambda: (env.ours() or {}).get("status") == "False")
    finally:
        stop.set()
        thread.join(10)
    reasons = [r for _, r, _ in env.events()]
    # (The unload is two file changes here: a look between them may tell two reasons.)
    assert reasons[:2] == ["NodeNotReadyForGpus", "NodeReadyForGpus"]
    assert reasons[2:] and set(reasons[2:]) == {"NodeNotReadyForGpus"}
    assert env.events()[0][0] == "Warning"
    # The gate is off: no taint or label was written, only status and events.
    assert env.write_paths() <= {
        f"/api/v1/nodes/{NODE}/status", "/api/v1/namespaces/default/events"}
    assert readiness.driver_pending(HostRoot(env.root))


def wait_for(predicate: object, seconds: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("timed out")
