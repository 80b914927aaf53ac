"""A node's token against the fleet: it reaches only its own node (the stand-in API server runs
the shipped RBAC and ValidatingAdmissionPolicy), an admin's cordon made during an upgrade is
never undone, DaemonSet, mirror and unschedulable-tolerating GPU pods are waited for, not
evicted, a malformed annotation is a clear error naming it, and a node left mid-upgrade is
restored even once the protocol is switched off."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("celpy", reason="pip install cel-python")

import requests
from lib.fakes import FakeRunner
from lib.hosttrees import make_host

from cluster.apiserver import Cluster
from cluster.nodes import (
    LABELS,
    NODE,
    PAUSED,
    PLUGIN,
    Env,
    make_room,
)
from installer import app, host
from installer.cluster import protocol
from installer.cluster.client import NodeClient
from installer.config import Config
from installer.errors import (
    ClusterApiForbidden,
    ClusterApiUnavailable,
    EvictionTimeout,
    UpgradeAnnotationInvalid,
)
from installer.plan import Context, Plan, Target

OTHER = "gpu-node-2"
CONTROL_PLANE = "control-plane-1"
NO_SCHEDULE = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def _raw_patch(env: Env, node: str, patch: dict, manager: str) -> requests.Response:
    """A merge patch as `kubectl` sends it (its own field manager), with the same token."""
    return requests.patch(f"{env.server.url}/api/v1/nodes/{node}?fieldManager={manager}",
                          json=patch, timeout=10,
                          headers={"Authorization": f"Bearer {env.cluster.token}",
                                   "Content-Type": "application/merge-patch+json"})


# ------------------------------------------------------------- a token reaches its own node only


def _raw(env: Env, method: str, path: str, body: dict | None = None) -> requests.Response:
    """A request with the node's token, as an attacker holding it would send it."""
    return requests.request(method, f"{env.server.url}{path}", json=body, timeout=10,
                            headers={"Authorization": f"Bearer {env.cluster.token}"})


def test_the_token_of_one_node_cannot_touch_another(env: Env) -> None:
    env.cluster.add_node(OTHER, {"nvidia.com/gpu.deploy.device-plugin": "true"})
    control = env.cluster.add_node(CONTROL_PLANE, {})
    control["spec"]["taints"] = [NO_SCHEDULE]
    coredns = env.cluster.add_pod("kube-system", "coredns-1", OTHER)
    env.cluster.add_pod("ml", "train-elsewhere", OTHER, gpus=1)
    before = {n: env.cluster.node(n) for n in (OTHER, CONTROL_PLANE)}

    other = NodeClient(OTHER, str(env.kubeconfig))
    with pytest.raises(ClusterApiForbidden) as cordon:
        other.patch_node({"spec": {"unschedulable": True}})
    assert (f"may change only the node its pod runs on ({NODE}), not {OTHER}"
            in cordon.value.message)
    with pytest.raises(ClusterApiForbidden):
        other.patch_node({"spec": {"taints": [{"key": "evil", "effect": "NoExecute"}]}})
    with pytest.raises(ClusterApiForbidden):
        NodeClient(CONTROL_PLANE, str(env.kubeconfig)).patch_node({"spec": {"taints": None}})
    own = NodeClient(NODE, str(env.kubeconfig))
    with pytest.raises(ClusterApiForbidden, match="may not add, change or remove taints"):
        own.patch_node({"spec": {"taints": [{"key": "evil", "effect": "NoExecute"}]}})
    with pytest.raises(ClusterApiForbidden, match="labels"):
        own.patch_node({"metadata": {"labels": {"kubernetes.io/hostname": "elsewhere"}}})
    # Deleting a pod of another node: the role may delete pods, the policy refuses (the
    # request carries the pod, so its node), with or without the uid.
    with pytest.raises(ClusterApiForbidden, match=r"may delete only pods on its own node "
                       rf"\({NODE}\)"):
        own.delete_pod("kube-system", "coredns-1", coredns["metadata"]["uid"])
    deleted = _raw(env, "DELETE", "/api/v1/namespaces/kube-system/pods/coredns-1",
                   {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
    assert deleted.status_code == 403 and "pods on its own node" in deleted.json()["message"]
    # An Eviction names a pod, not its node, so no policy can scope it: the role grants none.
    for namespace, name in (("kube-system", "coredns-1"), ("ml", "train-elsewhere")):
        evicted = _raw(env, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                       {"apiVersion": "policy/v1", "kind": "Eviction",
                        "metadata": {"name": name, "namespace": namespace}})
        assert evicted.status_code == 403, evicted.text
        assert 'cannot create resource "pods/eviction"' in evicted.json()["message"]
    own.event(env.node()["metadata"]["uid"], "Probe", "about my own node")
    other.event(env.node(OTHER)["metadata"]["uid"], "Forged",
                "about another node")  # best effort: refused, logged

    assert {n: env.cluster.node(n) for n in (OTHER, CONTROL_PLANE)} == before
    assert {("kube-system", "coredns-1"), ("ml", "train-elsewhere")} <= set(env.cluster.pods)
    assert not any(p["metadata"].get("deletionTimestamp") for p in env.cluster.pods.values())
    assert [r for r, _ in env.events()] == ["Probe"]
    # What the protocol itself writes on its own node passes (the other tests run it all).
    own.patch_node({"spec": {"unschedulable": True},
                    "metadata": {"labels": {PLUGIN: PAUSED}}})


def test_a_token_without_a_node_claim_changes_no_node(env: Env) -> None:
    env.cluster.token_node = None  # a long-lived Secret token, or a cluster older than 1.30
    with pytest.raises(ClusterApiForbidden, match="the token carries no node claim"):
        make_room(env, env.config())
    assert env.node()["metadata"]["labels"] == LABELS
    assert "unschedulable" not in env.node()["spec"]


# ---------------------------------------------------------------- an admin's cordon is theirs


def test_an_admins_cordon_made_during_the_upgrade_is_never_undone(env: Env) -> None:
    config = env.config()
    layout = env.layout(config)
    make_room(env, config)
    # During the upgrade an admin takes the node out for maintenance: `kubectl uncordon`,
    # `kubectl cordon` (each its own field manager, as kubectl sends them).
    assert _raw_patch(env, NODE, {"spec": {"unschedulable": None}},
                      "kubectl-uncordon").status_code == 200
    assert _raw_patch(env, NODE, {"spec": {"unschedulable": True}},
                      "kubectl-cordon").status_code == 200

    protocol.finish(config, layout)

    after = env.node()
    assert after["spec"]["unschedulable"] is True
    assert after["metadata"]["labels"][PLUGIN] == "true"  # the rest is restored
    assert after["metadata"]["annotations"] == {}
    assert "left cordoned" in env.events()[-1][1]


def test_the_installers_own_cordon_is_undone(env: Env) -> None:
    config = env.config()
    make_room(env, config)
    manager = [e["manager"] for e in env.node()["metadata"]["managedFields"]]
    assert manager == ["nvidia-driver-installer"]
    protocol.finish(config, env.layout(config))
    assert "unschedulable" not in env.node()["spec"]


# ------------------------------------------------- pods that would come back are waited for


def test_daemonset_mirror_and_tolerating_pods_are_waited_for_not_evicted(env: Env) -> None:
    env.cluster.add_pod("kube-system", "dcgm-exporter-x", NODE, gpus=1, owner_kind="DaemonSet")
    env.cluster.add_pod("kube-system", "static-gpu-probe", NODE, gpus=1,
                        annotations={"kubernetes.io/config.mirror": "abc123"})
    env.cluster.add_pod("ml", "train", NODE, gpus=1)

    def controllers_react(cluster: Cluster, node: dict) -> None:
        # The DaemonSet stops selecting the paused node; the static pod's manifest is removed.
        if node["metadata"]["labels"].get(PLUGIN) == PAUSED:
            def leave() -> None:
                with cluster.lock:
                    cluster.pods.pop(("kube-system", "dcgm-exporter-x"), None)
                    cluster.pods.pop(("kube-system", "static-gpu-probe"), None)
            threading.Timer(0.5, leave).start()

    env.cluster.on_node_change.append(controllers_react)
    make_room(env, env.config())

    deleted = [r.path for r in env.cluster.requests if r.method == "DELETE"]
    assert deleted == ["/api/v1/namespaces/ml/pods/train"]
    not_evicted = [m for r, m in env.events() if r == "GpuPodNotEvicted"]
    assert len(not_evicted) == 2
    assert any("DaemonSet pod" in m for m in not_evicted)
    assert any("mirror pod" in m for m in not_evicted)


def test_a_pod_tolerating_unschedulable_is_named_not_evicted_or_deleted(env: Env) -> None:
    env.cluster.add_pod("ml", "sticky", NODE, gpus=1,
                        tolerations=[{"key": "node.kubernetes.io/unschedulable",
                                      "operator": "Exists", "effect": "NoSchedule"}])
    config = env.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="0.5",
                        NVIDIA_INSTALLER_FORCE_EVICTION="true")
    with pytest.raises(EvictionTimeout, match=r"ml/sticky \(tolerates node\.kubernetes\.io/"
                       "unschedulable: it would come back at once\\)"):
        make_room(env, config)
    assert not [r for r in env.cluster.requests
                if r.path.endswith("/eviction") or r.method == "DELETE"]
    assert "unschedulable" not in env.node()["spec"]  # restored


# ----------------------------------------------------------------- a malformed annotation


@pytest.mark.parametrize("annotation", ['{"labels":{}}', "not json", '{"from": 1}',
                                        '{"from":"a","to":"b","cordoned":true,'
                                        '"labels":{"kubernetes.io/hostname":"x"}}'])
def test_a_malformed_upgrade_annotation_is_a_clear_error_naming_it(env: Env,
                                                                   annotation: str) -> None:
    env.cluster.nodes[NODE]["metadata"]["annotations"][protocol.ANNOTATION] = annotation
    env.cluster.nodes[NODE]["spec"]["unschedulable"] = True
    config = env.config()
    layout = env.layout(config)
    before = env.node()
    for attempt in (lambda: protocol.finish(config, layout), lambda: make_room(env, config)):
        with pytest.raises(UpgradeAnnotationInvalid) as info:
            attempt()
        assert info.value.exit_code == 89
        assert f"node {NODE}: the annotation {protocol.ANNOTATION} is " in info.value.message
        assert "kubectl annotate node" in info.value.hint
    assert env.node() == before  # nothing was changed


# -------------------------------------------------- a node left mid-upgrade, protocol now off

def no_steps(env: Env, config: Config) -> Plan:
    """A plan with no steps (the install itself is stubbed out) for a real host context, whose
    upgrade gate the run chooses from `config` as the planner does."""
    root = make_host(env.root)
    layout = env.layout(config)
    facts = host.gather(root, free_space_path=env.root)
    target = Target("580.126.20", 580, "open", facts.kernel_release, "runfile", [], None, True,
                    ())
    ctx = Context(config, root, layout, FakeRunner(), facts, target, lambda *a: Path())
    return Plan(ctx, [], [])


def test_a_node_left_mid_upgrade_is_restored_with_the_protocol_switched_off(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    on = env.config()
    make_room(env, on)  # then the run is killed, and the operator turns the protocol off
    off = env.config(NVIDIA_INSTALLER_UPGRADE_PROTOCOL="false")
    layout = env.layout(off)
    monkeypatch.setattr(app.pipeline, "execute", lambda plan, done=None: [])  # the install itself

    app._execute(off, layout, plan=no_steps(env, off))

    after = env.node()
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"][PLUGIN] == "true"
    assert after["metadata"]["annotations"] == {}
    assert not protocol.hint_path(layout).exists()
    writes = len(env.cluster.writes())
    app._execute(off, layout, plan=no_steps(env, off))
    assert len(env.cluster.writes()) == writes  # and then never again


def test_without_node_name_a_node_left_mid_upgrade_is_an_error_not_forgotten(
    env: Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    make_room(env, env.config())
    off = env.config(NVIDIA_INSTALLER_UPGRADE_PROTOCOL="false", NODE_NAME="")
    monkeypatch.setattr(app.pipeline, "execute", lambda plan, done=None: [])
    with pytest.raises(ClusterApiUnavailable, match="NODE_NAME is unset: cannot restore it"):
        app._execute(off, env.layout(off), plan=no_steps(env, off))
    assert env.node()["spec"]["unschedulable"] is True
