"""The upgrade protocol with the installer's API client (installer/cluster/client.py) against a
real kube-apiserver (tests/lib/controlplane.py): the node's cordon, labels, annotation and
events, GPU pods deleted by uid once their PodDisruptionBudgets allow it (the budgets' status is
kube-controller-manager's disruption controller's; the installer checks them as the Eviction API
would), timeouts, an unreachable API, a run killed mid-way. The installer talks through the
fault-injecting proxy (tests/lib/apiproxy.py, which records its requests) with a token bound to
a Pod on its Node, under the shipped RBAC and admission policy; the node agent
(tests/lib/nodeagent.py) runs the pods and finishes their deletion as a kubelet would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from lib.controlplane import kubeconfig

from cluster.realdrain import (
    DRA_PLUGIN,
    PLUGIN,
    Drain,
    cordon,
    drain,
    drop_finalizers,
    exit_process,
    exits_when_paused,
    healthy_pods,
    hold,
    label_node,
    pdb,
    pod_with,
    ready,
    trimmed_rbac,
)
from installer.cluster import protocol
from installer.config import Config
from installer.errors import (
    ClusterApiForbidden,
    ClusterApiUnavailable,
    DriverHoldersTimeout,
    EvictionTimeout,
    InstallerError,
)
from installer.hostroot import HostRoot
from installer.layout import Layout

__all__ = ["drain"]  # the fixture, imported for pytest

REPO = Path(__file__).resolve().parents[2]
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
DCGM_EXPORTER = "nvidia.com/gpu.deploy.dcgm-exporter"
PAUSED = protocol.PAUSED
PLUGIN_PID = 4242


@pytest.fixture
def d(drain: Drain) -> Drain:
    """The node with the device plugin on and an administrator's dcgm-exporter off."""
    label_node(drain, {DCGM_EXPORTER: "false", DRA_PLUGIN: None})
    return drain


def layout_of(config: Config) -> Layout:
    return Layout.from_config(config, HostRoot(config.root))


def node(d: Drain) -> dict[str, Any]:
    return d.real.get_node(d.node)


def events(d: Drain) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in d.real.events(d.node)]


def deletes(d: Drain) -> list[tuple[str, dict[str, Any]]]:
    """The installer's DELETEs as they reached the server: (path, options)."""
    return [(urlsplit(s.path).path, json.loads(s.body or b"{}"))
            for s in d.proxy.writes() if s.method == "DELETE"]


def test_upgrade_cordons_pauses_evicts_waits_then_restores_exactly(d: Drain) -> None:
    train_uid = pod_with(d, "train")["metadata"]["uid"]
    pod_with(d, "train-elsewhere", node=d.other)
    pod_with(d, "frontend", gpus=0)
    config = ready(d)
    layout = layout_of(config)
    before = node(d)

    with exits_when_paused(d, PLUGIN_PID, "nvidia-device-pl"):
        d.make_room(config)

    during = node(d)
    assert during["spec"]["unschedulable"] is True
    labels = during["metadata"]["labels"]
    assert labels[PLUGIN] == PAUSED and labels[GFD] == PAUSED
    assert labels[DCGM_EXPORTER] == "false"  # an admin's "off" is not ours to change
    assert labels[protocol.STATE_LABEL] == "unloading"
    assert protocol.ANNOTATION in during["metadata"]["annotations"]
    assert d.pods() == {"train-elsewhere", "frontend"}
    # Drained by a DELETE of that very pod (its uid a precondition, its own grace period),
    # never through the Eviction API, which the role no longer grants.
    assert not [s for s in d.proxy.seen if urlsplit(s.path).path.endswith("/eviction")]
    assert deletes(d) == [(f"/api/v1/namespaces/{d.ns}/pods/train",
                           {"apiVersion": "v1", "kind": "DeleteOptions",
                            "preconditions": {"uid": train_uid}})]
    # Pods are listed only with the field selector of its own node (RBAC cannot enforce it).
    lists = [parse_qs(urlsplit(s.path).query) for s in d.proxy.seen
             if urlsplit(s.path).path == "/api/v1/pods"]
    assert lists and all(q == {"fieldSelector": [f"spec.nodeName={d.node}"]} for q in lists)
    reasons = [r for r, _ in events(d)]
    # WaitingForDriverHolders too, unless the plugin was already gone (timing).
    assert reasons[:2] == ["DriverUpgradeStarted", "GpuPodEvicted"]
    assert reasons[-1] == "DriverUnloading"
    assert not (d.root / "proc" / str(PLUGIN_PID)).exists()
    assert protocol.hint_path(layout).exists()

    protocol.finish(config, layout)

    after = node(d)
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"] == {**before["metadata"]["labels"],
                                           protocol.STATE_LABEL: "upgrade-done"}
    assert after["metadata"].get("annotations", {}) == before["metadata"].get("annotations", {})
    assert events(d)[-1][0] == "DriverUpgradeDone"
    assert not protocol.hint_path(layout).exists()


def test_already_cordoned_node_stays_cordoned(d: Drain) -> None:
    cordon(d)
    config = ready(d)
    d.make_room(config)
    protocol.finish(config, layout_of(config))
    after = node(d)
    assert after["spec"]["unschedulable"] is True
    assert after["metadata"]["labels"][PLUGIN] == "true"
    assert "left cordoned" in events(d)[-1][1]


def test_nothing_to_restore_means_no_write(d: Drain) -> None:
    config = ready(d)
    protocol.finish(config, layout_of(config))
    assert d.proxy.writes() == []
    assert [(s.method, s.path) for s in d.proxy.seen] == [("GET", f"/api/v1/nodes/{d.node}")]


def record_healthy_at_delete(d: Drain, labels: dict[str, str]) -> list[int]:
    """Ready, not terminating pods with `labels` as the server has them just before each of
    the installer's DELETEs is passed on: what a budget protects, at the moment a pod goes."""
    seen: list[int] = []
    d.proxy.before("DELETE", rf"/api/v1/namespaces/{d.ns}/pods/",
                   lambda: seen.append(healthy_pods(d, labels)), times=1000)
    return seen


def in_background(d: Drain, config: Config) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            d.make_room(config)
        except BaseException as e:  # handed to the test's thread
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def wait_for_event(d: Drain, reason: str, errors: list[BaseException]) -> None:
    deadline = time.monotonic() + 60
    while reason not in [r for r, _ in events(d)]:
        assert time.monotonic() < deadline and not errors, errors
        time.sleep(0.1)


def test_pdb_blocks_then_allows(d: Drain) -> None:
    serve = {"app": "serve"}
    pod_with(d, "serve-0", labels=serve)
    config = ready(d)
    pdb(d, "serve", serve, min_available=1, healthy=1)
    healthy_at_delete = record_healthy_at_delete(d, serve)

    thread, errors = in_background(d, config)
    wait_for_event(d, "EvictionBlocked", errors)
    pod_with(d, "serve-1", node=d.other, labels=serve)  # a second replica becomes Ready
    thread.join(60)

    assert not thread.is_alive() and errors == []
    assert d.pods() == {"serve-1"}
    # Deleted once, and only when the budget allowed it: two Ready replicas then.
    assert healthy_at_delete == [2]
    pdb_reads = [s for s in d.proxy.seen if urlsplit(s.path).path ==
                 f"/apis/policy/v1/namespaces/{d.ns}/poddisruptionbudgets"]
    assert len(pdb_reads) > 1, "the budget never blocked"
    assert not [s for s in d.proxy.seen if urlsplit(s.path).path.endswith("/eviction")]
    reasons = [r for r, _ in events(d)]
    assert reasons.count("EvictionBlocked") == 1 and "GpuPodEvicted" in reasons
    assert dict(events(d))["EvictionBlocked"] == (
        f"pod {d.ns}/serve-0: PodDisruptionBudget {d.ns}/serve allows no disruption now "
        "(it needs 1 healthy pods and has 1); retrying")


def test_a_pod_list_that_ignores_the_field_selector_touches_no_other_node(d: Drain) -> None:
    """An API server (or a proxy) answering with every pod of the cluster: the installer still
    deletes only its own node's GPU pods, and asks to delete nothing else. The proxy drops the
    field selector, and the real server answers the list as it would without one."""
    pod_with(d, "train")
    pod_with(d, "train-elsewhere", node=d.other)
    config = ready(d)
    d.proxy.rewrite("GET", r"/api/v1/pods$", lambda path: urlsplit(path).path)
    d.make_room(config)
    every = [s for s in d.proxy.seen if urlsplit(s.path).path == "/api/v1/pods"]
    assert every and all(s.status == 200 for s in every)
    assert [path for path, _ in deletes(d)] == [f"/api/v1/namespaces/{d.ns}/pods/train"]
    assert d.pods() == {"train-elsewhere"}


def test_two_pods_of_one_budget_are_not_both_taken_from_one_allowance(d: Drain) -> None:
    """Two replicas on this node, one elsewhere, minAvailable 2: one disruption is allowed.
    The Eviction API takes it off the budget's status at the first eviction; the installer,
    deleting, must count it itself until the disruption controller writes a new status: the
    second goes only once a replacement is healthy elsewhere."""
    web = {"app": "web"}
    for name, on in (("web-0", d.node), ("web-1", d.node), ("web-2", d.other)):
        pod_with(d, name, node=on, labels=web)
    config = ready(d)
    pdb(d, "web", web, min_available=2, healthy=3)
    healthy_at_delete = record_healthy_at_delete(d, web)

    thread, errors = in_background(d, config)
    wait_for_event(d, "EvictionBlocked", errors)
    # One of the two went (the node agent finished its deletion); the other waits for the
    # budget however long: the replacement is made only once the first is gone.
    deadline = time.monotonic() + 60
    while len(d.pods() & {"web-0", "web-1"}) != 1:
        assert time.monotonic() < deadline and not errors, errors
        time.sleep(0.1)
    assert len(healthy_at_delete) == 1 and thread.is_alive()
    pod_with(d, "web-3", node=d.other, labels=web)  # the workload's replacement
    thread.join(60)

    assert not thread.is_alive() and errors == []
    assert d.pods() == {"web-2", "web-3"}
    assert healthy_at_delete == [3, 3]  # never below 2 after either
    assert len(deletes(d)) == 2
    assert all(s.status == 200 for s in d.proxy.writes() if s.method == "DELETE")


@pytest.mark.parametrize(("pdbs", "ready_pod", "deleted"), [
    # Two budgets select the pod: the Eviction API refuses it (500); so does the installer.
    ([("a", {"app": "x"}, 0, 3), ("b", {"tier": "gpu"}, 0, 3)], True, False),
    # No disruption allowed, but the pod is not Ready and the others keep the budget whole:
    # it goes (unhealthyPodEvictionPolicy IfHealthyBudget, the default).
    ([("a", {"app": "x"}, 2, 2)], False, True),
    # policy/v1: an empty selector selects every pod of the namespace.
    ([("all", {}, 5, 3)], True, False),
    # A budget of another namespace has nothing to say.
    ([("elsewhere", {"app": "x"}, 5, 0, "other")], True, True),
])
def test_budgets_decide_as_the_eviction_api_does(d: Drain, pdbs: list, ready_pod: bool,
                                                  deleted: bool) -> None:
    both = {"app": "x", "tier": "gpu"}
    pod_with(d, "p", labels=both)
    pod_with(d, "q", node=d.other, labels=both)
    pod_with(d, "r", node=d.other, labels=both)
    config = ready(d)
    if not ready_pod:  # its container's readiness probe fails: the kubelet says so
        d.cp.request("PATCH", f"/api/v1/namespaces/{d.ns}/pods/p/status",
                     {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
                     content_type="application/strategic-merge-patch+json")
    for name, selector, minimum, healthy, *namespace in pdbs:
        ns = d.cp.namespace(f"{d.ns}-{namespace[0]}") if namespace else d.ns
        pdb(d, name, selector, namespace=ns, min_available=minimum, healthy=healthy)
    config = d.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="0.5")
    if deleted:
        d.make_room(config)
        assert d.pods() == {"q", "r"}
    else:
        with pytest.raises(EvictionTimeout, match=rf"{d.ns}/p \((PodDisruptionBudget|more "
                           r"than one PodDisruptionBudget selects it \(a, b\))"):
            d.make_room(config)
        assert not deletes(d)
        assert d.pods() == {"p", "q", "r"}


def test_pod_that_never_leaves_times_out_and_restores_labels_and_cordon(d: Drain) -> None:
    pod_with(d, "stuck", finalizers=["example.com/keep"])
    config = ready(d)
    before = node(d)["metadata"]
    config = d.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="1")
    layout = layout_of(config)
    try:
        with pytest.raises(EvictionTimeout) as caught:
            d.make_room(config)
    finally:
        drop_finalizers(d, "stuck")
    assert caught.value.exit_code == 73
    assert (f"GPU pods still on node {d.node} after 1 s: {d.ns}/stuck (terminating)"
            in caught.value.message)
    after = node(d)
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"] == {**before["labels"],
                                           protocol.STATE_LABEL: "upgrade-failed"}
    assert after["metadata"].get("annotations", {}) == before.get("annotations", {})
    assert events(d)[-1][0] == "DriverUpgradeFailed"
    assert not protocol.hint_path(layout).exists()


def test_pdb_that_never_allows_is_deleted_only_with_force(d: Drain) -> None:
    solo_uid = pod_with(d, "solo", labels={"app": "solo"})["metadata"]["uid"]
    pod_with(d, "idle", gpus=0)  # no GPU: never a client of the drain
    ready(d)
    # minAvailable 1 of 1. (With maxUnavailable 0 the disruption controller finds no
    # controller to count the pods against and writes desiredHealthy 0: blocked too.)
    pdb(d, "solo", {"app": "solo"}, min_available=1, healthy=1)
    with pytest.raises(EvictionTimeout, match=rf"{d.ns}/solo \(PodDisruptionBudget {d.ns}/solo "
                       r"allows no disruption now \(it needs 1 healthy pods and has 1\)\)"):
        d.make_room(d.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="0.5"))
    assert d.pods() == {"solo", "idle"}
    assert not deletes(d)
    assert "unschedulable" not in node(d)["spec"]  # restored

    # components/force-eviction grants nothing more: the same role, the switch on.
    d.make_room(d.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="0.5",
                         NVIDIA_INSTALLER_FORCE_EVICTION="true"))
    assert d.pods() == {"idle"}
    assert [options for _, options in deletes(d)] == [
        {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": solo_uid},
         "gracePeriodSeconds": 0}]


def test_holders_are_named_in_an_event_until_they_close(d: Drain) -> None:
    hold(d, PLUGIN_PID, "nvidia-device-pl")
    hold(d, 777, "dcgm-hostengine", "/dev/nvidiactl")
    config = ready(d)
    thread, errors = in_background(d, config)
    wait_for_event(d, "WaitingForDriverHolders", errors)
    exit_process(d, PLUGIN_PID)
    exit_process(d, 777)
    thread.join(60)
    assert not thread.is_alive() and errors == []
    waiting = dict(events(d))["WaitingForDriverHolders"]
    assert waiting.startswith(f"PIDs 777, {PLUGIN_PID} hold the driver: ")
    assert "pid 777 (dcgm-hostengine) holds /dev/nvidiactl" in waiting
    assert f"pid {PLUGIN_PID} (nvidia-device-pl) holds /dev/nvidia0" in waiting
    assert node(d)["metadata"]["labels"][protocol.STATE_LABEL] == "unloading"


def test_a_holder_that_stays_is_named_and_the_node_restored(d: Drain) -> None:
    hold(d, 777, "dcgm-hostengine", "/dev/nvidiactl")
    ready(d)
    with pytest.raises(DriverHoldersTimeout) as caught:
        d.make_room(d.config(NVIDIA_INSTALLER_HOLDERS_TIMEOUT="0.5"))
    assert caught.value.exit_code == 74
    assert "pid 777 (dcgm-hostengine) holds /dev/nvidiactl" in caught.value.message
    after = node(d)
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"][PLUGIN] == "true"


def test_conflicting_writer_gets_a_409_and_both_changes_survive(d: Drain) -> None:
    config = ready(d)
    # An administrator labels the node between the installer's read and its first write.
    d.proxy.before("PATCH", rf"/api/v1/nodes/{d.node}$",
                   lambda: label_node(d, {"team": "vision"}))
    d.make_room(config)
    patches = [s.status for s in d.proxy.seen
               if s.method == "PATCH" and urlsplit(s.path).path == f"/api/v1/nodes/{d.node}"]
    assert patches[0] == 409 and 200 in patches[1:]
    labels = node(d)["metadata"]["labels"]
    assert labels["team"] == "vision" and labels[PLUGIN] == PAUSED


def test_api_unreachable(d: Drain, tmp_path: Path) -> None:
    ready(d)
    dead = kubeconfig(tmp_path / "dead", "https://127.0.0.1:9", d.proxy.tls.ca_file,
                      token="unused")
    config = d.config(NVIDIA_INSTALLER_KUBECONFIG=str(dead))
    layout = layout_of(config)
    with pytest.raises(ClusterApiUnavailable) as caught:
        d.make_room(config)
    assert caught.value.exit_code == 70
    assert f"could not read node {d.node}" in caught.value.message
    assert not protocol.hint_path(layout).exists()
    protocol.finish(config, layout)  # nothing known to restore: a warm run goes on
    protocol.hint_path(layout).write_text("x")
    with pytest.raises(ClusterApiUnavailable):
        protocol.finish(config, layout)


def test_missing_permission_is_forbidden(d: Drain, tmp_path: Path) -> None:
    def no_delete(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**r, "verbs": [v for v in r["verbs"] if v != "delete"]} for r in rules]

    pod_with(d, "train")
    config = ready(d, trimmed_rbac(d, tmp_path, "no-delete", no_delete))
    with pytest.raises(ClusterApiForbidden) as caught:
        d.make_room(config)
    assert caught.value.exit_code == 71
    assert f"could not delete pod {d.ns}/train" in caught.value.message
    assert [s.status for s in d.proxy.writes() if s.method == "DELETE"] == [403]
    assert d.pods() == {"train"}
    after = node(d)
    assert protocol.ANNOTATION not in after["metadata"].get("annotations", {})  # restored
    assert "unschedulable" not in after["spec"]


def test_failed_run_after_unload_keeps_the_node_cordoned_and_marks_it(d: Drain) -> None:
    config = ready(d)
    layout = layout_of(config)
    d.make_room(config)
    protocol.failed(config, layout, InstallerError("the build broke"))
    marked = node(d)
    assert marked["spec"]["unschedulable"] is True
    assert marked["metadata"]["labels"][protocol.STATE_LABEL] == "upgrade-failed"
    assert marked["metadata"]["labels"][PLUGIN] == PAUSED
    assert events(d)[-1][0] == "DriverUpgradeFailed"
    protocol.finish(config, layout)  # the next run succeeds
    assert "unschedulable" not in node(d)["spec"]


KILLED_RUN = """
import sys
from installer.cluster import drain, protocol
from installer.config import build_config
from installer.hostroot import HostRoot
from installer.layout import Layout
protocol.POLL_SECONDS = drain.POLL_SECONDS = 0.05
config = build_config(dict(a.split("=", 1) for a in sys.argv[1:]), {})
layout = Layout.from_config(config, HostRoot(config.root))
layout.install_local.mkdir(parents=True, exist_ok=True)
protocol.make_room(config, HostRoot(config.root), layout, "580.105.08", "580.126.20")
"""


@pytest.mark.parametrize("cordoned_before", [False, True])
def test_kill_mid_way_then_rerun_restores_the_node_as_it_was(d: Drain,
                                                             cordoned_before: bool) -> None:
    if cordoned_before:
        cordon(d)
    pod_with(d, "stuck", finalizers=["example.com/keep"])
    config = ready(d)
    before = node(d)["metadata"]
    layout = layout_of(config)
    args = [f"{k}={v}" for k, v in {
        "NVIDIA_INSTALLER_UPGRADE_PROTOCOL": "true", "NODE_NAME": d.node,
        "NVIDIA_INSTALLER_KUBECONFIG": str(d.kubeconfig), "ROOT_MOUNT_DIR": str(d.root),
        "NVIDIA_INSTALL_DIR_CONTAINER": str(d.root / "no-mount"),
        "NVIDIA_INSTALLER_EVICTION_TIMEOUT": "60"}.items()]
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, *args],
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and run.poll() is None:
            stuck = d.cp.get(f"/api/v1/namespaces/{d.ns}/pods/stuck")
            if stuck["metadata"].get("deletionTimestamp"):
                break
            time.sleep(0.05)
        assert run.poll() is None, "the first run ended on its own"
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    killed = node(d)
    assert killed["spec"]["unschedulable"] is True
    assert killed["metadata"]["labels"][PLUGIN] == PAUSED
    assert protocol.ANNOTATION in killed["metadata"]["annotations"]

    drop_finalizers(d, "stuck")  # the pod finally leaves
    d.make_room(config)  # the restarted pod continues the upgrade
    protocol.finish(config, layout)

    after = node(d)
    assert after["spec"].get("unschedulable", False) is cordoned_before
    assert after["metadata"]["labels"] == {**before["labels"],
                                           protocol.STATE_LABEL: "upgrade-done"}
    assert after["metadata"].get("annotations", {}) == before.get("annotations", {})
    assert d.pods() == set()
