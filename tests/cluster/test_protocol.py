"""The upgrade protocol with the installer's API client (installer/cluster/client.py) against
the stand-in API server: the node's cordon, labels, annotation and events, GPU pods deleted by
uid once their PodDisruptionBudgets allow it (the installer checks them, as the Eviction API
would), timeouts, an unreachable API, a run killed mid-way. The stand-in enforces the shipped
RBAC and the ValidatingAdmissionPolicy on every call, with a token bound to NODE."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from cluster.apiserver import Cluster, cluster_role_rules, write_kubeconfig
from cluster.nodes import (
    DCGM_EXPORTER,
    GFD,
    LABELS,
    NODE,
    PAUSED,
    PLUGIN,
    PLUGIN_PID,
    RBAC,
    REPO,
    Env,
    make_room,
)
from installer.cluster import protocol
from installer.errors import (
    ClusterApiForbidden,
    ClusterApiUnavailable,
    DriverHoldersTimeout,
    EvictionTimeout,
    InstallerError,
)


def plugin_exits_when_paused(env: Env) -> None:
    """The stand-in plays the DaemonSet controller and kubelet: the device plugin's process
    goes (its grace period later) once its deploy label is paused."""
    env.hold(PLUGIN_PID, "nvidia-device-pl")

    def react(cluster: Cluster, node: dict) -> None:
        if node["metadata"]["labels"].get(PLUGIN) == PAUSED:
            threading.Timer(0.5, env.exit, (PLUGIN_PID,)).start()

    env.cluster.on_node_change.append(react)


def test_upgrade_cordons_pauses_evicts_waits_then_restores_exactly(env: Env) -> None:
    plugin_exits_when_paused(env)
    train_uid = env.cluster.add_pod("ml", "train", NODE, gpus=1)["metadata"]["uid"]
    env.cluster.add_pod("ml", "train-elsewhere", "gpu-node-2", gpus=1)
    env.cluster.add_pod("web", "frontend", NODE)
    config = env.config()
    layout = env.layout(config)
    before = env.node()

    make_room(env, config)

    during = env.node()
    assert during["spec"]["unschedulable"] is True
    labels = during["metadata"]["labels"]
    assert labels[PLUGIN] == PAUSED and labels[GFD] == PAUSED
    assert labels[DCGM_EXPORTER] == "false"  # an admin's "off" is not ours to change
    assert labels[protocol.STATE_LABEL] == "unloading"
    assert protocol.ANNOTATION in during["metadata"]["annotations"]
    pods = set(env.cluster.pods)
    assert ("ml", "train") not in pods
    assert {("ml", "train-elsewhere"), ("web", "frontend")} <= pods
    # Drained by a DELETE of that very pod (its uid a precondition, its own grace period),
    # never through the Eviction API, which the role no longer grants.
    assert not [r for r in env.cluster.requests if r.path.endswith("/eviction")]
    assert [(r.path, r.body) for r in env.cluster.requests if r.method == "DELETE"] == [
        ("/api/v1/namespaces/ml/pods/train",
         {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": train_uid}})]
    # Pods are listed only with the field selector of its own node (RBAC cannot enforce it).
    lists = [parse_qs(r.query) for r in env.cluster.requests if r.path == "/api/v1/pods"]
    assert lists and all(q == {"fieldSelector": [f"spec.nodeName={NODE}"]} for q in lists)
    reasons = [r for r, _ in env.events()]
    # WaitingForDriverHolders too, unless the plugin was already gone (timing; see below).
    assert reasons[:2] == ["DriverUpgradeStarted", "GpuPodEvicted"]
    assert reasons[-1] == "DriverUnloading"
    assert not (env.root / "proc" / str(PLUGIN_PID)).exists()
    assert protocol.hint_path(layout).exists()

    protocol.finish(config, layout)

    after = env.node()
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"] == {**before["metadata"]["labels"],
                                           protocol.STATE_LABEL: "upgrade-done"}
    assert after["metadata"]["annotations"] == {}
    assert env.events()[-1][0] == "DriverUpgradeDone"
    assert not protocol.hint_path(layout).exists()


def test_already_cordoned_node_stays_cordoned(env: Env) -> None:
    env.cluster.nodes[NODE]["spec"]["unschedulable"] = True
    config = env.config()
    make_room(env, config)
    protocol.finish(config, env.layout(config))
    after = env.node()
    assert after["spec"]["unschedulable"] is True
    assert after["metadata"]["labels"][PLUGIN] == "true"
    assert "left cordoned" in env.events()[-1][1]


def test_nothing_to_restore_means_no_write(env: Env) -> None:
    config = env.config()
    protocol.finish(config, env.layout(config))
    assert env.cluster.writes() == []
    assert [(r.method, r.path) for r in env.cluster.requests] == [
        ("GET", f"/api/v1/nodes/{NODE}")]


def test_pdb_blocks_then_allows(env: Env) -> None:
    env.cluster.add_pod("ml", "serve-0", NODE, gpus=1, labels={"app": "serve"})
    env.cluster.add_pdb("ml", "serve", {"app": "serve"}, min_available=1)
    healthy_at_delete = record_healthy_at_delete(env, {"app": "serve"})

    def second_replica_becomes_ready() -> None:
        time.sleep(0.8)
        env.cluster.add_pod("ml", "serve-1", "gpu-node-2", gpus=1, labels={"app": "serve"})

    threading.Thread(target=second_replica_becomes_ready, daemon=True).start()
    config = env.config()
    make_room(env, config)
    assert ("ml", "serve-0") not in env.cluster.pods
    # Deleted once, and only when the budget allowed it: two Ready replicas then.
    assert healthy_at_delete == [("serve-0", 2)]
    pdb_reads = [r for r in env.cluster.requests
                 if r.path == "/apis/policy/v1/namespaces/ml/poddisruptionbudgets"]
    assert len(pdb_reads) > 1, "the budget never blocked"
    assert not [r for r in env.cluster.requests if r.path.endswith("/eviction")]
    reasons = [r for r, _ in env.events()]
    assert reasons.count("EvictionBlocked") == 1 and "GpuPodEvicted" in reasons
    blocked = dict(env.events())["EvictionBlocked"]
    assert blocked == ("pod ml/serve-0: PodDisruptionBudget ml/serve allows no disruption now "
                       "(it needs 1 healthy pods and has 1); retrying")


def test_a_pod_list_that_ignores_the_field_selector_touches_no_other_node(env: Env) -> None:
    """An API server (or a proxy) answering with every pod of the cluster: the installer still
    deletes only its own node's GPU pods, and asks to delete nothing else."""
    env.cluster.add_pod("ml", "train", NODE, gpus=1)
    env.cluster.add_pod("ml", "train-elsewhere", "gpu-node-2", gpus=1)
    every_pod = env.cluster.list_pods
    env.cluster.list_pods = lambda query: every_pod({})  # type: ignore[method-assign]
    make_room(env, env.config())
    assert [r.path for r in env.cluster.requests if r.method == "DELETE"] == [
        "/api/v1/namespaces/ml/pods/train"]
    assert ("ml", "train-elsewhere") in env.cluster.pods


def record_healthy_at_delete(env: Env, labels: dict[str, str]) -> list[tuple[str, int]]:
    """(pod, Ready pods with `labels` not terminating) at every DELETE the stand-in admits:
    what a budget protects, seen at the moment each pod is taken."""
    seen: list[tuple[str, int]] = []
    original = env.cluster.delete_pod

    def delete_pod(namespace: str, name: str, query: dict, options: object = None) -> dict:
        with env.cluster.lock:
            healthy = sum(1 for p in env.cluster.pods.values()
                          if all(p["metadata"]["labels"].get(k) == v for k, v in labels.items())
                          and not p["metadata"].get("deletionTimestamp"))
        answer = original(namespace, name, query, options)
        seen.append((name, healthy))
        return answer

    env.cluster.delete_pod = delete_pod  # type: ignore[method-assign]
    return seen


def test_two_pods_of_one_budget_are_not_both_taken_from_one_allowance(env: Env) -> None:
    """Two replicas on this node, one elsewhere, minAvailable 2: one disruption is allowed.
    The Eviction API takes it off the budget's status at the first eviction; the installer,
    deleting, must count it itself until the controller writes a new status."""
    for name, node_name in (("web-0", NODE), ("web-1", NODE), ("web-2", "gpu-node-2")):
        env.cluster.add_pod("ml", name, node_name, gpus=1, labels={"app": "web"})
    env.cluster.add_pdb("ml", "web", {"app": "web"}, min_available=2)
    healthy_at_delete = record_healthy_at_delete(env, {"app": "web"})

    def replacement_once_one_is_gone() -> None:
        while ("ml", "web-0") in env.cluster.pods and ("ml", "web-1") in env.cluster.pods:
            time.sleep(0.02)
        env.cluster.kubelet()
        env.cluster.add_pod("ml", "web-3", "gpu-node-3", gpus=1, labels={"app": "web"})

    threading.Thread(target=replacement_once_one_is_gone, daemon=True).start()
    make_room(env, env.config())
    assert {("ml", "web-0"), ("ml", "web-1")}.isdisjoint(env.cluster.pods)
    assert [healthy for _, healthy in healthy_at_delete] == [3, 3]  # never below 2 after


@pytest.mark.parametrize(("pdbs", "ready", "deleted"), [
    # Two budgets select the pod: the Eviction API refuses it (500); so does the installer.
    ([("a", {"app": "x"}, 0), ("b", {"tier": "gpu"}, 0)], True, False),
    # No disruption allowed, but the pod is not Ready and the others keep the budget whole:
    # it goes (unhealthyPodEvictionPolicy IfHealthyBudget, the default).
    ([("a", {"app": "x"}, 2)], False, True),
    # policy/v1: an empty selector selects every pod of the namespace.
    ([("all", {}, 5)], True, False),
    # A budget of another namespace has nothing to say.
    ([("elsewhere", {"app": "x"}, 5, "other")], True, True),
])
def test_budgets_decide_as_the_eviction_api_does(env: Env, pdbs: list, ready: bool,
                                                  deleted: bool) -> None:
    env.cluster.add_pod("ml", "p", NODE, gpus=1, labels={"app": "x", "tier": "gpu"},
                        ready=ready)
    env.cluster.add_pod("ml", "q", "gpu-node-2", gpus=1, labels={"app": "x", "tier": "gpu"})
    env.cluster.add_pod("ml", "r", "gpu-node-3", gpus=1, labels={"app": "x", "tier": "gpu"})
    for name, selector, minimum, *namespace in pdbs:
        env.cluster.add_pdb(namespace[0] if namespace else "ml", name, selector,
                            min_available=minimum)
    config = env.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="0.5")
    if deleted:
        make_room(env, config)
        assert ("ml", "p") not in env.cluster.pods
    else:
        with pytest.raises(EvictionTimeout, match=r"ml/p \((PodDisruptionBudget|more than "
                           r"one PodDisruptionBudget selects it \(a, b\))"):
            make_room(env, config)
        assert not [r for r in env.cluster.requests if r.method == "DELETE"]


def test_pod_that_never_leaves_times_out_and_restores_labels_and_cordon(env: Env) -> None:
    plugin_exits_when_paused(env)
    env.cluster.add_pod("ml", "stuck", NODE, gpus=1, finalizers=["example.com/keep"])
    config = env.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="1")
    layout = env.layout(config)
    with pytest.raises(EvictionTimeout) as caught:
        make_room(env, config)
    assert caught.value.exit_code == 73
    assert f"GPU pods still on node {NODE} after 1 s: ml/stuck (terminating)" in \
        caught.value.message
    after = env.node()
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"] == {**LABELS, protocol.STATE_LABEL: "upgrade-failed"}
    assert after["metadata"]["annotations"] == {}
    assert env.events()[-1][0] == "DriverUpgradeFailed"
    assert not protocol.hint_path(layout).exists()


def test_pdb_that_never_allows_is_deleted_only_with_force(env: Env) -> None:
    solo_uid = env.cluster.add_pod("ml", "solo", NODE, gpus=1,
                                   labels={"app": "solo"})["metadata"]["uid"]
    env.cluster.add_pdb("ml", "solo", {"app": "solo"}, max_unavailable=0)
    with pytest.raises(EvictionTimeout, match=r"ml/solo \(PodDisruptionBudget ml/solo allows "
                       r"no disruption now \(it needs 1 healthy pods and has 1\)\)"):
        make_room(env, env.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="0.5"))
    assert ("ml", "solo") in env.cluster.pods
    assert not any(r.method == "DELETE" for r in env.cluster.requests)
    assert "unschedulable" not in env.node()["spec"]  # restored

    # components/force-eviction grants nothing more: the same role, the switch on.
    make_room(env, env.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="0.5",
                              NVIDIA_INSTALLER_FORCE_EVICTION="true"))
    assert ("ml", "solo") not in env.cluster.pods
    assert [r.body for r in env.cluster.requests if r.method == "DELETE"] == [
        {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": solo_uid},
         "gracePeriodSeconds": 0}]


def test_holders_are_named_in_an_event_until_they_close(env: Env) -> None:
    env.hold(PLUGIN_PID, "nvidia-device-pl")
    env.hold(777, "dcgm-hostengine", "/dev/nvidiactl")

    def close_once_named() -> None:
        while not any(r == "WaitingForDriverHolders" for r, _ in env.events()):
            time.sleep(0.02)
        env.exit(PLUGIN_PID)
        env.exit(777)

    closer = threading.Thread(target=close_once_named, daemon=True)
    closer.start()
    make_room(env, env.config())
    closer.join(5)
    waiting = dict(env.events())["WaitingForDriverHolders"]
    assert waiting.startswith(f"PIDs 777, {PLUGIN_PID} hold the driver: ")
    assert "pid 777 (dcgm-hostengine) holds /dev/nvidiactl" in waiting
    assert f"pid {PLUGIN_PID} (nvidia-device-pl) holds /dev/nvidia0" in waiting
    assert env.node()["metadata"]["labels"][protocol.STATE_LABEL] == "unloading"


def test_a_holder_that_stays_is_named_and_the_node_restored(env: Env) -> None:
    env.hold(777, "dcgm-hostengine", "/dev/nvidiactl")
    config = env.config(NVIDIA_INSTALLER_HOLDERS_TIMEOUT="0.5")
    with pytest.raises(DriverHoldersTimeout) as caught:
        make_room(env, config)
    assert caught.value.exit_code == 74
    assert "pid 777 (dcgm-hostengine) holds /dev/nvidiactl" in caught.value.message
    after = env.node()
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"][PLUGIN] == "true"


def test_conflicting_writer_gets_a_409_and_both_changes_survive(env: Env) -> None:
    original = env.cluster.get_node
    raced = []

    def get_then_someone_else_writes(name: str) -> dict:
        answer = original(name)
        if not raced:
            raced.append(True)
            node = env.cluster.nodes[name]
            node["metadata"]["labels"]["team"] = "vision"
            node["metadata"]["resourceVersion"] = env.cluster.next_rv()
        return answer

    env.cluster.get_node = get_then_someone_else_writes  # type: ignore[method-assign]
    make_room(env, env.config())
    assert 409 in [r.status for r in env.cluster.requests if r.method == "PATCH"]
    labels = env.node()["metadata"]["labels"]
    assert labels["team"] == "vision" and labels[PLUGIN] == PAUSED


def test_api_unreachable(env: Env, tmp_path: Path) -> None:
    dead = write_kubeconfig(tmp_path / "dead", "http://127.0.0.1:9", env.cluster.token)
    config = env.config(NVIDIA_INSTALLER_KUBECONFIG=str(dead))
    layout = env.layout(config)
    with pytest.raises(ClusterApiUnavailable) as caught:
        make_room(env, config)
    assert caught.value.exit_code == 70
    assert f"could not read node {NODE}" in caught.value.message
    assert not protocol.hint_path(layout).exists()
    protocol.finish(config, layout)  # nothing known to restore: a warm run goes on
    protocol.hint_path(layout).write_text("x")
    with pytest.raises(ClusterApiUnavailable):
        protocol.finish(config, layout)


def test_missing_permission_is_forbidden(env: Env) -> None:
    env.cluster.rules = [{**r, "verbs": [v for v in r["verbs"] if v != "delete"]}
                         for r in cluster_role_rules(RBAC)]
    env.cluster.add_pod("ml", "train", NODE, gpus=1)
    with pytest.raises(ClusterApiForbidden) as caught:
        make_room(env, env.config())
    assert caught.value.exit_code == 71
    assert "could not delete pod ml/train" in caught.value.message
    assert env.node()["metadata"]["annotations"] == {}  # restored


def test_failed_run_after_unload_keeps_the_node_cordoned_and_marks_it(env: Env) -> None:
    config = env.config()
    layout = env.layout(config)
    make_room(env, config)
    protocol.failed(config, layout, InstallerError("the build broke"))
    node = env.node()
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"][protocol.STATE_LABEL] == "upgrade-failed"
    assert node["metadata"]["labels"][PLUGIN] == PAUSED
    assert env.events()[-1][0] == "DriverUpgradeFailed"
    protocol.finish(config, layout)  # the next run succeeds
    assert "unschedulable" not in env.node()["spec"]


KILLED_RUN = """
import sys
from installer.cluster import drain, protocol
from installer.config import build_config
from installer.hostroot import HostRoot
from installer.layout import Layout
protocol.POLL_SECONDS = drain.POLL_SECONDS = 0.05
config = build_config(dict(a.split("=", 1) for a in sys.argv[1:]), {})
layout = Layout.from_config(config, HostRoot(config.root))
protocol.make_room(config, HostRoot(config.root), layout, "580.105.08", "580.126.20")
"""


@pytest.mark.parametrize("cordoned_before", [False, True])
def test_kill_mid_way_then_rerun_restores_the_node_as_it_was(env: Env,
                                                             cordoned_before: bool) -> None:
    if cordoned_before:
        env.cluster.nodes[NODE]["spec"]["unschedulable"] = True
    env.cluster.add_pod("ml", "stuck", NODE, gpus=1, finalizers=["example.com/keep"])
    config = env.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="60")
    layout = env.layout(config)
    args = [f"{k}={v}" for k, v in {
        "NVIDIA_INSTALLER_UPGRADE_PROTOCOL": "true", "NODE_NAME": NODE,
        "NVIDIA_INSTALLER_KUBECONFIG": str(env.kubeconfig), "ROOT_MOUNT_DIR": str(env.root),
        "NVIDIA_INSTALL_DIR_CONTAINER": str(env.root / "no-container-mount"),
        "NVIDIA_INSTALLER_EVICTION_TIMEOUT": "60"}.items()]
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, *args],
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and run.poll() is None:
            if ("ml", "stuck") in env.cluster.pods and env.cluster.pods[("ml", "stuck")][
                    "metadata"].get("deletionTimestamp"):
                break
            time.sleep(0.05)
        assert run.poll() is None, "the first run ended on its own"
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    killed = env.node()
    assert killed["spec"]["unschedulable"] is True
    assert killed["metadata"]["labels"][PLUGIN] == PAUSED
    assert protocol.ANNOTATION in killed["metadata"]["annotations"]

    env.cluster.remove_finalizers("ml", "stuck")  # the pod finally leaves
    make_room(env, config)  # the restarted pod continues the upgrade
    protocol.finish(config, layout)

    after = env.node()
    assert after["spec"].get("unschedulable", False) is cordoned_before
    assert after["metadata"]["labels"] == {**LABELS, protocol.STATE_LABEL: "upgrade-done"}
    assert after["metadata"]["annotations"] == {}
