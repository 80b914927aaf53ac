"""A node's token against the fleet, on the real control plane (tests/cluster/realdrain.py: the
shipped upgrade-protocol RBAC bound to the test's account, its ValidatingAdmissionPolicy
enforced, a token bound to a Pod on the node, the installer's requests through the recording
proxy, the node agent running the pods): the token reaches only its own node, an admin's cordon
made during an upgrade is never undone, DaemonSet (a real DaemonSet's, taken back by its
controller), mirror and unschedulable-tolerating GPU pods are waited for, not evicted, a
malformed annotation is a clear error naming it, and a node left mid-upgrade is restored even
once the protocol is switched off."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from lib.controlplane import ApiError
from lib.fakes import FakeRunner
from lib.hosttrees import make_host

from cluster.realdrain import PLUGIN, Drain, drain, ready, watching
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
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.plan import Context, Plan, Target

__all__ = ["drain"]  # the fixture, imported for pytest

PAUSED = "paused-for-driver-upgrade"
NO_SCHEDULE = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
MERGE = "application/merge-patch+json"


def layout_of(config: Config) -> Layout:
    layout = Layout.from_config(config, HostRoot(config.root))
    layout.install_local.mkdir(parents=True, exist_ok=True)
    return layout


def node_of(d: Drain, name: str | None = None) -> dict[str, Any]:
    return d.cp.get(f"/api/v1/nodes/{name or d.node}")


def events(d: Drain, name: str | None = None) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in d.real.events(name or d.node)]


def admin_patch(d: Drain, node: str, patch: dict[str, Any], manager: str) -> None:
    """A merge patch as `kubectl` sends it, with its own field manager."""
    d.cp.request("PATCH", f"/api/v1/nodes/{node}", patch, content_type=MERGE,
                 query={"fieldManager": manager})


def raw(d: Drain, token: str, method: str, path: str,
        body: dict[str, Any] | None = None) -> requests.Response:
    """A request with the node's token, as an attacker holding it would send it."""
    return requests.request(method, f"{d.proxy.url}{path}", json=body, timeout=30,
                            verify=str(d.proxy.tls.ca_file),
                            headers={"Authorization": f"Bearer {token}"})


def token_in(d: Drain) -> str:
    import json

    return str(json.loads(d.kubeconfig.read_text())["users"][0]["user"]["token"])


# ------------------------------------------------------------- a token reaches its own node only


def test_the_token_of_one_node_cannot_touch_another(drain: Drain) -> None:
    cp = drain.cp
    control = f"{drain.ns}-control-plane"
    drain.real.node(control)
    admin_patch(drain, control, {"spec": {"taints": [NO_SCHEDULE]}}, "kubeadm")
    drain.gpu_pod("coredns-1", node=drain.other, gpus=0)
    drain.gpu_pod("train-elsewhere", node=drain.other)
    ready(drain)
    token = token_in(drain)
    before = {n: node_of(drain, n)["metadata"]["resourceVersion"] for n in (drain.other, control)}

    other = NodeClient(drain.other, str(drain.kubeconfig))
    with pytest.raises(ClusterApiForbidden) as cordon:
        other.patch_node({"spec": {"unschedulable": True}})
    assert (f"may change only the node its pod runs on ({drain.node}), not {drain.other}"
            in cordon.value.message)
    with pytest.raises(ClusterApiForbidden):
        other.patch_node({"spec": {"taints": [{"key": "evil", "effect": "NoExecute"}]}})
    with pytest.raises(ClusterApiForbidden):
        NodeClient(control, str(drain.kubeconfig)).patch_node({"spec": {"taints": None}})
    own = NodeClient(drain.node, str(drain.kubeconfig))
    with pytest.raises(ClusterApiForbidden, match="may not add, change or remove taints"):
        own.patch_node({"spec": {"taints": [{"key": "evil", "effect": "NoExecute"}]}})
    with pytest.raises(ClusterApiForbidden, match="label"):
        own.patch_node({"metadata": {"labels": {"kubernetes.io/hostname": "elsewhere"}}})
    # Deleting a pod of another node: the role may delete pods, the policy refuses, with or
    # without the uid.
    coredns = cp.get(f"/api/v1/namespaces/{drain.ns}/pods/coredns-1")
    with pytest.raises(ClusterApiForbidden, match=r"may delete only pods on its own node "
                       rf"\({drain.node}\)"):
        own.delete_pod(drain.ns, "coredns-1", coredns["metadata"]["uid"])
    deleted = raw(drain, token, "DELETE", f"/api/v1/namespaces/{drain.ns}/pods/coredns-1",
                  {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
    assert deleted.status_code == 403 and "pods on its own node" in deleted.json()["message"]
    # An Eviction names a pod, not its node, so no policy can scope it: the role grants none.
    for name in ("coredns-1", "train-elsewhere"):
        evicted = raw(drain, token, "POST",
                      f"/api/v1/namespaces/{drain.ns}/pods/{name}/eviction",
                      {"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": name, "namespace": drain.ns}})
        assert evicted.status_code == 403, evicted.text
        assert 'cannot create resource "pods/eviction"' in evicted.json()["message"]
    own.event(node_of(drain)["metadata"]["uid"], "Probe", "about my own node")
    other.event(node_of(drain, drain.other)["metadata"]["uid"], "Forged",
                "about another node")  # best effort: refused, logged

    after = {n: node_of(drain, n)["metadata"]["resourceVersion"] for n in (drain.other, control)}
    assert after == before
    pods = cp.get(f"/api/v1/namespaces/{drain.ns}/pods")["items"]
    assert {p["metadata"]["name"] for p in pods} == {"coredns-1", "train-elsewhere"}
    assert not any(p["metadata"].get("deletionTimestamp") for p in pods)
    assert [r for r, _ in events(drain)] == ["Probe"]
    assert events(drain, drain.other) == []
    # What the protocol itself writes on its own node passes (the other tests run it all).
    own.patch_node({"spec": {"unschedulable": True}, "metadata": {"labels": {PLUGIN: PAUSED}}})


def test_a_token_without_a_node_claim_changes_no_node(drain: Drain) -> None:
    """A token bound to no Pod (a long-lived Secret's, or one from an older cluster) carries
    no node claim: the shipped policy refuses its writes to any node."""
    config = ready(drain)
    unbound = drain.cp.create(
        f"/api/v1/namespaces/{drain.real.namespace}/serviceaccounts/{drain.real.account}/token",
        {"spec": {"audiences": [], "expirationSeconds": 3600}})["status"]["token"]
    drain.proxy.kubeconfig(drain.kubeconfig, unbound)
    labels = node_of(drain)["metadata"]["labels"]
    with pytest.raises(ClusterApiForbidden, match="the token carries no node claim"):
        drain.make_room(config)
    assert node_of(drain)["metadata"]["labels"] == labels
    assert "unschedulable" not in node_of(drain)["spec"]


# ---------------------------------------------------------------- an admin's cordon is theirs


def test_an_admins_cordon_made_during_the_upgrade_is_never_undone(drain: Drain) -> None:
    config = ready(drain)
    drain.make_room(config)
    # During the upgrade an admin takes the node out for maintenance: `kubectl uncordon`,
    # `kubectl cordon` (each its own field manager, as kubectl sends them).
    admin_patch(drain, drain.node, {"spec": {"unschedulable": None}}, "kubectl-uncordon")
    admin_patch(drain, drain.node, {"spec": {"unschedulable": True}}, "kubectl-cordon")

    protocol.finish(config, layout_of(config))

    after = node_of(drain)
    assert after["spec"]["unschedulable"] is True
    assert after["metadata"]["labels"][PLUGIN] == "true"  # the rest is restored
    assert protocol.ANNOTATION not in (after["metadata"].get("annotations") or {})
    assert "left cordoned" in events(drain)[-1][1]


def test_the_installers_own_cordon_is_undone(drain: Drain) -> None:
    config = ready(drain)
    drain.make_room(config)
    cordoned_by = [e["manager"] for e in node_of(drain)["metadata"]["managedFields"]
                   if "f:unschedulable" in str(e.get("fieldsV1"))]
    assert cordoned_by == ["nvidia-driver-installer"]
    protocol.finish(config, layout_of(config))
    assert "unschedulable" not in node_of(drain)["spec"]


# ------------------------------------------------- pods that would come back are waited for


def test_daemonset_mirror_and_tolerating_pods_are_waited_for_not_evicted(drain: Drain) -> None:
    """A real DaemonSet's GPU pod and a mirror pod are waited for, never deleted by the
    installer: once the installer says it waits for each (its GpuPodNotEvicted event), the
    DaemonSet stops selecting the node (its controller takes the pod back) and the static
    pod's manifest is removed; only the workload's pod is deleted by the installer."""
    cp = drain.cp
    selected = "test.nvidia.com/dcgm-exporter"
    admin_patch(drain, drain.node, {"metadata": {"labels": {selected: "true"}}}, "kubectl")
    cp.request("PATCH", f"/api/v1/nodes/{drain.node}/status", {"status": {
        "capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"}}},
        content_type="application/strategic-merge-patch+json")
    daemonsets = f"/apis/apps/v1/namespaces/{drain.ns}/daemonsets"
    cp.create(daemonsets, {
        "metadata": {"name": "dcgm-exporter"},
        "spec": {"selector": {"matchLabels": {"app": "dcgm-exporter"}},
                 "template": {"metadata": {"labels": {"app": "dcgm-exporter"}}, "spec": {
                     "nodeSelector": {selected: "true", "kubernetes.io/hostname": drain.node},
                     # The node keeps the not-ready taint admission put on it at creation
                     # (no node lifecycle controller here to lift it).
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "main", "image": "dcgm-exporter", "resources": {
                         "limits": {"nvidia.com/gpu": "1"}}}]}}}})
    cp.create(f"/api/v1/namespaces/{drain.ns}/pods", {
        "metadata": {"name": "static-gpu-probe",
                     "annotations": {"kubernetes.io/config.mirror": "abc123"}},
        "spec": {"nodeName": drain.node, "containers": [{
            "name": "main", "image": "probe",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    drain.gpu_pod("train")
    deadline = time.monotonic() + 60
    while len(drain.pods()) != 3:  # the DaemonSet's pod, scheduled onto the node
        assert time.monotonic() < deadline, drain.pods()
        time.sleep(0.1)
    config = ready(drain)

    def leave_once_waited_for(stop: threading.Event) -> None:
        left: set[str] = set()
        while len(left) < 2 and not stop.wait(0.1):
            waited = " ".join(m for r, m in events(drain) if r == "GpuPodNotEvicted")
            if "dcgm-exporter-" in waited and "daemonset" not in left:
                admin_patch(drain, drain.node, {"metadata": {"labels": {selected: None}}},
                            "kubectl")
                left.add("daemonset")
            if "static-gpu-probe" in waited and "mirror" not in left:
                with contextlib.suppress(ApiError):
                    cp.request("DELETE", f"/api/v1/namespaces/{drain.ns}/pods/static-gpu-probe",
                               {"gracePeriodSeconds": 0})
                left.add("mirror")

    try:
        with watching(leave_once_waited_for):
            drain.make_room(config)
    finally:
        with contextlib.suppress(ApiError):
            cp.request("DELETE", f"{daemonsets}/dcgm-exporter")

    deleted = [s.path.split("?")[0] for s in drain.proxy.writes() if s.method == "DELETE"]
    assert deleted == [f"/api/v1/namespaces/{drain.ns}/pods/train"]
    assert not any(s.path.split("?")[0].endswith("/eviction") for s in drain.proxy.seen)
    assert drain.pods() == set()
    not_evicted = [m for r, m in events(drain) if r == "GpuPodNotEvicted"]
    assert len(not_evicted) == 2
    assert any("DaemonSet pod" in m for m in not_evicted)
    assert any("mirror pod" in m for m in not_evicted)


def test_a_pod_tolerating_unschedulable_is_named_not_evicted_or_deleted(drain: Drain) -> None:
    drain.cp.create(f"/api/v1/namespaces/{drain.ns}/pods", {
        "metadata": {"name": "sticky"},
        "spec": {"nodeName": drain.node, "tolerations": [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
             "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "cuda",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    ready(drain)
    config = drain.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="0.5",
                          NVIDIA_INSTALLER_FORCE_EVICTION="true")
    with pytest.raises(EvictionTimeout, match=rf"{drain.ns}/sticky \(tolerates node\."
                       r"kubernetes\.io/unschedulable: it would come back at once\)"):
        drain.make_room(config)
    assert not [s for s in drain.proxy.seen
                if s.path.split("?")[0].endswith("/eviction") or s.method == "DELETE"]
    assert drain.pods() == {"sticky"}
    assert "unschedulable" not in node_of(drain)["spec"]  # restored


# ----------------------------------------------------------------- a malformed annotation


@pytest.mark.parametrize("annotation", ['{"labels":{}}', "not json", '{"from": 1}',
                                        '{"from":"a","to":"b","cordoned":true,'
                                        '"labels":{"kubernetes.io/hostname":"x"}}'])
def test_a_malformed_upgrade_annotation_is_a_clear_error_naming_it(drain: Drain,
                                                                   annotation: str) -> None:
    config = ready(drain)
    admin_patch(drain, drain.node, {"metadata": {"annotations": {protocol.ANNOTATION:
                                                                 annotation}},
                                    "spec": {"unschedulable": True}}, "kubectl-edit")
    layout = layout_of(config)
    before = node_of(drain)
    for attempt in (lambda: protocol.finish(config, layout), lambda: drain.make_room(config)):
        with pytest.raises(UpgradeAnnotationInvalid) as info:
            attempt()
        assert info.value.exit_code == 89
        assert (f"node {drain.node}: the annotation {protocol.ANNOTATION} is "
                in info.value.message)
        assert info.value.hint and "kubectl annotate node" in info.value.hint
    assert node_of(drain) == before  # nothing was changed
    assert drain.proxy.writes() == []


# -------------------------------------------------- a node left mid-upgrade, protocol now off

def no_steps(root: Path, config: Config) -> Plan:
    """A plan with no steps (the install itself is stubbed out) for a real host context, whose
    upgrade gate the run chooses from `config` as the planner does."""
    host_root = make_host(root)
    layout = layout_of(config)
    facts = host.gather(host_root, free_space_path=root)
    target = Target("580.126.20", 580, "open", facts.kernel_release, "runfile", [], None, True,
                    ())
    ctx = Context(config, host_root, layout, FakeRunner(), facts, target, lambda *a: Path())
    return Plan(ctx, [], [])


def test_a_node_left_mid_upgrade_is_restored_with_the_protocol_switched_off(
    drain: Drain, monkeypatch: pytest.MonkeyPatch
) -> None:
    on = ready(drain)
    drain.make_room(on)  # then the run is killed, and the operator turns the protocol off
    off = drain.config(NVIDIA_INSTALLER_UPGRADE_PROTOCOL="false")
    layout = layout_of(off)
    monkeypatch.setattr(app.pipeline, "execute", lambda plan, done=None: [])  # the install itself

    app._execute(off, layout, plan=no_steps(drain.root, off))

    after = node_of(drain)
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"][PLUGIN] == "true"
    assert protocol.ANNOTATION not in (after["metadata"].get("annotations") or {})
    assert not protocol.hint_path(layout).exists()
    writes = len(drain.proxy.writes())
    app._execute(off, layout, plan=no_steps(drain.root, off))
    assert len(drain.proxy.writes()) == writes  # and then never again


def test_without_node_name_a_node_left_mid_upgrade_is_an_error_not_forgotten(
    drain: Drain, monkeypatch: pytest.MonkeyPatch
) -> None:
    drain.make_room(ready(drain))
    off = drain.config(NVIDIA_INSTALLER_UPGRADE_PROTOCOL="false", NODE_NAME="")
    monkeypatch.setattr(app.pipeline, "execute", lambda plan, done=None: [])
    with pytest.raises(ClusterApiUnavailable, match="NODE_NAME is unset: cannot restore it"):
        app._execute(off, layout_of(off), plan=no_steps(drain.root, off))
    assert node_of(drain)["spec"]["unschedulable"] is True
