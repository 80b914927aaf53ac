"""The shipped ValidatingAdmissionPolicies (daemonset/components/*/admission-policy.yaml, read as
shipped) and RBAC created in a real kube-apiserver (tests/lib/controlplane.py), judged with the
server's own CEL, on requests made with real tokens from the TokenRequest API bound to a Pod on
a Node: for each rule, what it exists to deny is denied and what the installer must do is
admitted, and what is admitted is what the server stores. Kubernetes' status controller must
report no type-checking warning for any of them."""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from lib.controlplane import ApiError, ControlPlane, kubeconfig, token_claims
from lib.manifests import DAEMONSET_DIR
from lib.realcluster import RealNodes

from installer.cluster import protocol
from installer.cluster.client import NodeClient
from installer.cluster.protocol import PAUSED

COMPONENTS = DAEMONSET_DIR / "components"
POLICY_FILES = sorted(COMPONENTS.glob("*/admission-policy.yaml"))
RBAC_FILES = sorted(COMPONENTS.glob("*/rbac.yaml"))
GATE_TAINT = {"key": "nvidia.com/gpu.driver-not-ready", "value": "true", "effect": "NoSchedule"}
STATE_LABEL = "nvidia-driver-installer/upgrade-state"
UPGRADE_ANNOTATION = "nvidia-driver-installer/upgrade"
PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
# A ServiceAccount whose name the policies match (it ends in nvidia-driver-installer) bound to
# the scheduling gate's ClusterRole only: the policies read the roles through `authorizer`.
GATE_ONLY = "gate-only-nvidia-driver-installer"


def policies() -> list[dict[str, Any]]:
    return [d for f in POLICY_FILES for d in yaml.safe_load_all(f.read_text())
            if d and d["kind"] == "ValidatingAdmissionPolicy"]


def _denied(call: Callable[[], Any]) -> str:
    with pytest.raises(ApiError) as info:
        call()
    assert info.value.status == 403, info.value.body
    return str(info.value.body.get("message", ""))


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> ControlPlane:
    """The shipped RBAC and policies applied (server-side) and enforced."""
    cp = control_plane
    for f in RBAC_FILES + POLICY_FILES:
        done = cp.apply("apply", "--server-side", "--force-conflicts", "-f", str(f))
        assert done.returncode == 0, done.stderr
    cp.service_account("kube-system", GATE_ONLY)
    cp.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": GATE_ONLY},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "nvidia-driver-installer-scheduling-gate"},
        "subjects": [{"kind": "ServiceAccount", "name": GATE_ONLY,
                      "namespace": "kube-system"}]})
    # The server's admission plugin learns of new policies through its informer: wait until
    # each kind of request the policies judge is denied for another node (dry run: nothing
    # is written).
    cp.node("probe-a")
    cp.node("probe-b")
    pod_b = _pod(cp, "probe-b", "probe-victim")
    token = cp.pod_token("probe-a")
    dry = {"dryRun": "All"}
    probes = [
        lambda: cp.request("PATCH", "/api/v1/nodes/probe-b", {"metadata": {"labels": {
            STATE_LABEL: "draining"}}}, token=token, content_type=MERGE, query=dry),
        lambda: cp.request("PATCH", "/api/v1/nodes/probe-b/status", {"status": {"conditions": [
            {"type": "NvidiaDriverReady", "status": "True"}]}}, token=token, content_type=SMP,
            query=dry),
        lambda: cp.create("/api/v1/namespaces/default/events", _event("probe-b"), token=token,
                          query=dry),
        lambda: cp.request("DELETE", f"/api/v1/namespaces/{pod_b[0]}/pods/{pod_b[1]}",
                           token=token, query=dry),
    ]
    deadline = time.monotonic() + 60
    for probe in probes:
        while True:
            try:
                probe()
            except ApiError as e:
                if e.status == 403 and "ValidatingAdmissionPolicy" in str(e):
                    break
            assert time.monotonic() < deadline, "the shipped policies were never enforced"
            time.sleep(0.2)
    return cp


_count = iter(range(1_000_000))


@pytest.fixture
def nodes(cluster: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """Makes Nodes named after the test (a real registration: labels, a taint, Ready), deleted
    when it ends: a Node left with an upgrade state would count in another test's pool."""
    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    made: list[str] = []

    def make(taints: list[dict[str, str]] | None = None, **labels: str) -> str:
        name = f"{base}-{next(_count)}"
        cluster.node(name, labels={PLUGIN: "true", **labels},
                     taints=taints or [{"key": "nvidia.com/gpu", "value": "present",
                                        "effect": "NoSchedule"}])
        made.append(name)
        return name

    yield make
    for name in made:
        with contextlib.suppress(ApiError):
            cluster.request("DELETE", f"/api/v1/nodes/{name}")


def _pod(cp: ControlPlane, node: str, name: str, namespace: str = "workloads") -> tuple[str, str]:
    cp.namespace(namespace)
    try:
        cp.create(f"/api/v1/namespaces/{namespace}/pods", {
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "gpu:test"}]}})
    except ApiError as e:
        if e.status != 409:
            raise
    return namespace, name


def _event(node: str, kind: str = "Node", name: str | None = None) -> dict[str, Any]:
    return {"metadata": {"generateName": "nvidia-driver-installer."},
            "involvedObject": {"kind": kind, "name": name or node, "apiVersion": "v1"},
            "reason": "DriverInstalled", "message": "driver 580.105.08 loaded", "type": "Normal",
            "source": {"component": "nvidia-driver-installer", "host": node}}


def patch_node(cp: ControlPlane, node: str, body: dict[str, Any], token: str,
               content_type: str = SMP) -> dict[str, Any]:
    return cp.request("PATCH", f"/api/v1/nodes/{node}", body, token=token,
                      content_type=content_type)


def patch_status(cp: ControlPlane, node: str, body: dict[str, Any], token: str) -> dict[str, Any]:
    return cp.request("PATCH", f"/api/v1/nodes/{node}/status", body, token=token,
                      content_type=SMP)


def ready_condition(status: str = "True") -> dict[str, Any]:
    return {"type": "NvidiaDriverReady", "status": status, "reason": "DriverLoaded",
            "message": "580.105.08"}


# --- the policies as the server sees them ---------------------------------------------------


# The status controller type-checks each policy against every kind its rules reach: a rule on
# group "" events reaches events.k8s.io/v1 Event too (no involvedObject there), and own-pods
# judges Pods and Events with the same expressions. The policies read those through dyn().
TYPE_CHECK_CASES = [p["metadata"]["name"] for p in policies()]


def test_every_policy_shipped_is_created(cluster: ControlPlane) -> None:
    """The server compiled each policy at create (a syntax or unknown-name error is a 422)
    and stored it as shipped."""
    names = {p["metadata"]["name"] for p in policies()}
    assert names >= {
        "nvidia-driver-installer-node-condition", "nvidia-driver-installer-node-events",
        "nvidia-driver-installer-own-node", "nvidia-driver-installer-own-pods",
        "nvidia-driver-installer-scheduling-gate"}
    for policy in policies():
        stored = cluster.get("/apis/admissionregistration.k8s.io/v1/"
                             f"validatingadmissionpolicies/{policy['metadata']['name']}")
        assert stored["spec"]["validations"] == policy["spec"]["validations"]


@pytest.mark.parametrize("name", TYPE_CHECK_CASES)
def test_the_status_controller_reports_no_type_error(cluster: ControlPlane, name: str) -> None:
    """kube-controller-manager's status controller type-checks each policy against the
    server's own schemas: any warning is an expression that fails at run time, and with
    failurePolicy: Fail that denies every request it reaches."""
    deadline = time.monotonic() + 60
    while True:
        stored = cluster.get(
            f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}")
        status = stored.get("status", {})
        if status.get("observedGeneration") == stored["metadata"]["generation"]:
            break
        assert time.monotonic() < deadline, f"{name}: never type-checked"
        time.sleep(0.2)
    warnings = status.get("typeChecking", {}).get("expressionWarnings", [])
    assert warnings == [], f"{name}: {warnings}"


def test_a_type_error_is_reported_by_the_status_controller(cluster: ControlPlane) -> None:
    """What the test above relies on: a policy that compiles but reads a field Node does not
    have is created (no 422) and then carries the warning."""
    name = "type-error-probe"
    cluster.create("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", {
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
            "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
            "resources": ["nodes"]}]},
            "validations": [{"expression": "object.spec.noSuchField == 'x'"}]}})
    try:
        deadline = time.monotonic() + 60
        while True:
            status = cluster.get("/apis/admissionregistration.k8s.io/v1/"
                                 f"validatingadmissionpolicies/{name}").get("status", {})
            warnings = status.get("typeChecking", {}).get("expressionWarnings", [])
            if warnings:
                break
            assert time.monotonic() < deadline, "no typeChecking warning for a type error"
            time.sleep(0.2)
        assert warnings[0]["fieldRef"] == "spec.validations[0].expression"
        assert "noSuchField" in warnings[0]["warning"]
    finally:
        cluster.request("DELETE", "/apis/admissionregistration.k8s.io/v1/"
                        f"validatingadmissionpolicies/{name}")


def test_the_token_carries_the_pod_and_node_it_is_bound_to(cluster: ControlPlane,
                                                           nodes: Callable[..., str]) -> None:
    node = nodes()
    claims = token_claims(cluster.pod_token(node))["kubernetes.io"]
    assert claims["node"]["name"] == node
    assert claims["node"]["uid"] == cluster.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
    assert claims["serviceaccount"]["name"] == "nvidia-driver-installer"
    assert claims["pod"]["name"] == f"nvidia-driver-installer-{node}"[:63]


# --- nodes: own-node (upgrade protocol) and scheduling-gate policies ------------------------


def test_another_node_is_denied_its_own_admitted(cluster: ControlPlane,
                                                 nodes: Callable[..., str]) -> None:
    mine, other = nodes(), nodes()
    token = cluster.pod_token(mine)
    body = {"metadata": {"labels": {STATE_LABEL: "draining"}}, "spec": {"unschedulable": True}}
    message = _denied(lambda: patch_node(cluster, other, body, token))
    assert f"may change only the node its pod runs on ({mine}), not {other}" in message
    assert STATE_LABEL not in cluster.get(f"/api/v1/nodes/{other}")["metadata"]["labels"]
    stored = patch_node(cluster, mine, body, token)
    assert stored["metadata"]["labels"][STATE_LABEL] == "draining"
    assert stored["spec"]["unschedulable"] is True


def test_a_token_without_a_node_claim_is_denied(cluster: ControlPlane,
                                                nodes: Callable[..., str]) -> None:
    """A token not bound to a pod (a leaked long-lived one) names no node."""
    node = nodes()
    token = cluster.create("/api/v1/namespaces/kube-system/serviceaccounts/"
                           "nvidia-driver-installer/token",
                           {"spec": {"audiences": [], "expirationSeconds": 600}})["status"]["token"]
    message = _denied(lambda: patch_node(
        cluster, node, {"metadata": {"labels": {STATE_LABEL: "draining"}}}, token))
    assert "none: the token carries no node claim" in message


def test_labels_the_installer_writes_are_admitted_others_denied(
        cluster: ControlPlane, nodes: Callable[..., str]) -> None:
    node = nodes()
    token = cluster.pod_token(node)
    message = _denied(lambda: patch_node(
        cluster, node, {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},
        token))
    assert message.endswith("may not change the labels node-role.kubernetes.io/control-plane "
                            "(no feature of the installer writes them)")
    _denied(lambda: patch_node(cluster, node, {"metadata": {"labels": {
        "kubernetes.io/hostname": "elsewhere"}}}, token))
    message = _denied(lambda: patch_node(cluster, node, {"metadata": {"labels": {
        "kubernetes.io/hostname": None}}}, token, MERGE))
    assert "may not change the labels kubernetes.io/hostname" in message
    stored = patch_node(cluster, node, {"metadata": {"labels": {
        PLUGIN: "paused-for-driver-upgrade", STATE_LABEL: "draining",
        "nvidia-driver-installer/driver-version": "580.105.08"}}}, token)
    labels = stored["metadata"]["labels"]
    assert labels[PLUGIN] == "paused-for-driver-upgrade"
    assert labels["nvidia-driver-installer/driver-version"] == "580.105.08"
    assert labels["kubernetes.io/hostname"] == node


def test_the_denial_names_what_was_refused(cluster: ControlPlane,
                                           nodes: Callable[..., str]) -> None:
    """The server gives a messageExpression no `authorizer`, nor a variable that reads it
    (it falls back to the static message): the messages name the label, annotation or taint
    refused from the changes alone, and a feature's field refused for want of its role names
    that role."""
    node = nodes()
    token = cluster.pod_token(node)
    gate_only = cluster.pod_token(node, account=GATE_ONLY)
    cases: list[tuple[str, dict[str, Any], str]] = [
        # The server's CEL walks a map in no fixed order: one label refused, named alone.
        (token, {"metadata": {"labels": {"node-role.kubernetes.io/gpu": ""}}},
         "may not change the labels node-role.kubernetes.io/gpu (no feature of the "
         "installer writes them)"),
        (token, {"metadata": {"annotations": {"example.com/x": "1"}}},
         "may not change the annotations example.com/x (no feature of the installer writes "
         "them)"),
        (token, {"spec": {"taints": [{"key": "example.com/evil", "effect": "NoSchedule"}]}},
         "may not add, change or remove taints other than the scheduling gate taint "
         "(nvidia.com/gpu.driver-not-ready:NoSchedule): "),
        (gate_only, {"metadata": {"labels": {PLUGIN: "paused-for-driver-upgrade"}}},
         f"may not change the labels {PLUGIN} without the upgrade protocol's role "
         "(components/upgrade-protocol)"),
        (gate_only, {"metadata": {"annotations": {UPGRADE_ANNOTATION: "{}"}}},
         f"may not change the annotations {UPGRADE_ANNOTATION} without the upgrade "
         "protocol's role"),
        (gate_only, {"metadata": {"labels": {"nvidia.com/cuda.driver-version.full": "580"}}},
         "may not change the labels nvidia.com/cuda.driver-version.full without the cluster "
         "signals' role (components/cluster-signals)"),
    ]
    for who, body, says in cases:
        message = _denied(partial(patch_node, cluster, node, body, who, MERGE))
        assert says in message, message
        assert "ServiceAccount may change only the" not in message  # not the static fallback


def test_only_the_upgrade_annotation_is_admitted(cluster: ControlPlane,
                                                 nodes: Callable[..., str]) -> None:
    node = nodes()
    token = cluster.pod_token(node)
    message = _denied(lambda: patch_node(
        cluster, node, {"metadata": {"annotations": {"volumes.kubernetes.io/x": "1"}}}, token))
    assert message.endswith("may not change the annotations volumes.kubernetes.io/x (no "
                            "feature of the installer writes them)")
    stored = patch_node(cluster, node, {"metadata": {"annotations": {
        UPGRADE_ANNOTATION: '{"from":"580.105.08","to":"580.126.20"}'}}}, token)
    assert UPGRADE_ANNOTATION in stored["metadata"]["annotations"]


def test_only_the_gate_taint_is_admitted(cluster: ControlPlane,
                                         nodes: Callable[..., str]) -> None:
    """The installer sends the taint list as it read it with only the gate's taint added or
    taken out: the taints the server itself put on (TaintNodesByCondition's not-ready one on a
    new Node) and the pool's stay."""
    node = nodes()
    token = cluster.pod_token(node)
    taints = cluster.get(f"/api/v1/nodes/{node}")["spec"]["taints"]
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints
    message = _denied(lambda: patch_node(cluster, node, {"spec": {"taints": []}}, token,
                                         MERGE))
    assert "may not add, change or remove taints" in message
    _denied(lambda: patch_node(cluster, node, {"spec": {"taints": [
        *taints, {**GATE_TAINT, "effect": "NoExecute"}]}}, token, MERGE))
    _denied(lambda: patch_node(cluster, node, {"spec": {"taints": [
        *taints, {"key": "example.com/evil", "effect": "NoSchedule"}]}}, token, MERGE))
    stored = patch_node(cluster, node, {"spec": {"taints": [*taints, GATE_TAINT]}}, token,
                        MERGE)
    assert stored["spec"]["taints"] == [*taints, GATE_TAINT]
    stored = patch_node(cluster, node, {"spec": {"taints": taints}}, token, MERGE)
    assert stored["spec"]["taints"] == taints


def test_cordon_needs_the_upgrade_protocols_role(cluster: ControlPlane,
                                                 nodes: Callable[..., str]) -> None:
    node = nodes()
    gate_only = cluster.pod_token(node, account=GATE_ONLY)
    message = _denied(lambda: patch_node(cluster, node, {"spec": {"unschedulable": True}},
                                         gate_only))
    assert "only with the upgrade protocol's role" in message
    # The gate's own label is the gate role's; the upgrade state label is not.
    _denied(lambda: patch_node(cluster, node, {"metadata": {"labels": {
        STATE_LABEL: "draining"}}}, gate_only))
    stored = patch_node(cluster, node, {"metadata": {"labels": {
        "nvidia-driver-installer/driver-version": "580.105.08"}}}, gate_only)
    assert stored["metadata"]["labels"]["nvidia-driver-installer/driver-version"] == "580.105.08"
    stored = patch_node(cluster, node, {"spec": {"unschedulable": True}},
                        cluster.pod_token(node))
    assert stored["spec"]["unschedulable"] is True


def test_other_spec_fields_and_metadata_are_denied(cluster: ControlPlane,
                                                   nodes: Callable[..., str]) -> None:
    node = nodes()
    token = cluster.pod_token(node)
    message = _denied(lambda: patch_node(cluster, node, {"spec": {"providerID": "gce://x"}},
                                         token))
    assert "may change only spec.unschedulable" in message
    # Unset podCIDR may be set once by the server's own validation: the policy refuses it.
    message = _denied(lambda: patch_node(cluster, node, {"spec": {"podCIDR": "10.9.9.0/24"}},
                                         token))
    assert "may change only spec.unschedulable" in message
    assert "podCIDR" not in cluster.get(f"/api/v1/nodes/{node}")["spec"]
    message = _denied(lambda: patch_node(cluster, node, {"metadata": {
        "finalizers": ["example.com/hold"]}}, token, MERGE))
    assert "owner references or finalizers" in message
    uid = cluster.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
    _denied(lambda: patch_node(cluster, node, {"metadata": {"ownerReferences": [{
        "apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]}}, token, MERGE))
    stored = cluster.get(f"/api/v1/nodes/{node}")["metadata"]
    assert "finalizers" not in stored and "ownerReferences" not in stored


# --- nodes/status: the cluster-signals condition policy ------------------------------------


def test_the_condition_on_its_own_node_is_admitted_and_merged(cluster: ControlPlane,
                                                              nodes: Callable[..., str]) -> None:
    """A strategic merge patch keyed by `type`: the kubelet's Ready condition stays."""
    node = nodes()
    token = cluster.pod_token(node)
    stored = patch_status(cluster, node, {"status": {"conditions": [ready_condition()]}}, token)
    kinds = {c["type"]: c["status"] for c in stored["status"]["conditions"]}
    assert kinds == {"Ready": "True", "NvidiaDriverReady": "True"}
    before = stored["metadata"]["resourceVersion"]
    stored = patch_status(cluster, node, {"status": {"conditions": [ready_condition("False")]}},
                          token)
    assert {c["type"]: c["status"] for c in stored["status"]["conditions"]} == {
        "Ready": "True", "NvidiaDriverReady": "False"}
    assert int(stored["metadata"]["resourceVersion"]) > int(before)
    # The server tracks who wrote it: a managedFields entry for the status subresource.
    assert any(f.get("subresource") == "status" and f["manager"].startswith("Python-urllib")
               for f in stored["metadata"]["managedFields"])


def test_another_condition_type_and_status_field_are_denied(
        cluster: ControlPlane, nodes: Callable[..., str]) -> None:
    node = nodes()
    token = cluster.pod_token(node)
    message = _denied(lambda: patch_status(cluster, node, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "Fake"}]}}, token))
    assert "may change only the NvidiaDriverReady condition" in message
    message = _denied(lambda: patch_status(cluster, node, {"status": {
        "capacity": {"nvidia.com/gpu": "8"}}}, token))
    assert "no node status field but its" in message
    conditions = cluster.get(f"/api/v1/nodes/{node}")["status"]["conditions"]
    assert [(c["type"], c["status"]) for c in conditions] == [("Ready", "True")]


def test_another_nodes_status_is_denied(cluster: ControlPlane,
                                        nodes: Callable[..., str]) -> None:
    mine, other = nodes(), nodes()
    message = _denied(lambda: patch_status(cluster, other, {"status": {
        "conditions": [ready_condition()]}}, cluster.pod_token(mine)))
    assert f"only the status of the node its pod runs on ({mine}), not {other}" in message


def test_labels_through_nodes_status_are_denied(cluster: ControlPlane,
                                                nodes: Callable[..., str]) -> None:
    """The Node status strategy restores only spec: labels sent to nodes/status are saved, so
    the policy has to refuse them."""
    node = nodes()
    token = cluster.pod_token(node)
    message = _denied(lambda: patch_status(cluster, node, {"metadata": {"labels": {
        "node-role.kubernetes.io/control-plane": ""}}}, token))
    assert message.endswith("may change no node metadata through nodes/status "
                            "(changed: labels)")
    assert "node-role.kubernetes.io/control-plane" not in cluster.get(
        f"/api/v1/nodes/{node}")["metadata"]["labels"]


def test_owner_references_and_finalizers_through_nodes_status_never_reach_etcd(
        cluster: ControlPlane, nodes: Callable[..., str]) -> None:
    """The security review's finding, asked of the real server: whatever the policy says,
    the Node stored afterwards carries no finalizer and no owner reference the token sent
    (a finalizer would hold a deleted node forever; an owner reference to a deleted object
    lets the garbage collector delete the Node)."""
    node = nodes()
    token = cluster.pod_token(node)
    uid = cluster.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
    owner = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]
    for key, value in (("finalizers", ["example.com/hold"]), ("ownerReferences", owner)):
        body = {"metadata": {key: value}}
        # The premise, asked of the server: its Node status strategy keeps this metadata when
        # sent through nodes/status (the administrator's dry run answers the object as it
        # would be stored), so the policy's denial is all that keeps the token's out of etcd.
        would_be = cluster.request("PATCH", f"/api/v1/nodes/{node}/status", body,
                                   content_type=SMP, query={"dryRun": "All"})
        assert would_be["metadata"][key] == value
        message = _denied(partial(patch_status, cluster, node, body, token))
        assert message.endswith("may change no node metadata through nodes/status "
                                f"(changed: {key})")
        stored = cluster.get(f"/api/v1/nodes/{node}")["metadata"]
        assert "finalizers" not in stored and "ownerReferences" not in stored, stored


# --- events and pods ------------------------------------------------------------------------


def _installer_client(cp: ControlPlane, node: str, tmp: Path) -> NodeClient:
    """The installer's own client on `node`, with the token of a pod bound to it."""
    path = kubeconfig(tmp / f"{node}.kubeconfig", cp.url, cp.ca, token=cp.pod_token(node))
    return NodeClient(node, str(path))


def _events_about(cp: ControlPlane, node: str) -> list[dict[str, Any]]:
    return [e for e in cp.get("/api/v1/namespaces/default/events")["items"]
            if e["involvedObject"]["name"] == node]


def test_the_installers_own_events_are_admitted_as_sent(
        cluster: ControlPlane, nodes: Callable[..., str], tmp_path: Path) -> None:
    """What installer/cluster/events.py posts (NodeClient.event, through events.Poster: the
    node's uid read first) is admitted and stored as sent, with the Node's uid the token
    claims."""
    node = nodes()
    api = _installer_client(cluster, node, tmp_path)
    uid = api.get_node()["metadata"]["uid"]
    assert token_claims(cluster.pod_token(node))["kubernetes.io"]["node"]["uid"] == uid
    api.event(uid, "DriverVerified", "driver 580.105.08 verified in 1.0 s", action="Verify")
    api.event(uid, "DriverInstallFailed", "error[x]: y", warning=True, action="Install")
    stored = _events_about(cluster, node)
    assert sorted((e["type"], e["reason"]) for e in stored) == [
        ("Normal", "DriverVerified"), ("Warning", "DriverInstallFailed")]
    for event in stored:
        assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": node,
                                           "uid": uid}
        assert event["source"] == {"component": "nvidia-driver-installer", "host": node}
        assert event["reportingComponent"] == "nvidia-driver-installer"
        assert event["reportingInstance"] == f"nvidia-driver-installer-{node}"
        assert "related" not in event


def _installer_event(node: str, uid: str) -> dict[str, Any]:
    """The body NodeClient.event sends (tests/cluster/test_node_condition.py posts it through
    the client and checks it is admitted)."""
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{node}.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid},
            "reason": "DriverVerified", "message": "m", "type": "Normal",
            "source": {"component": "nvidia-driver-installer", "host": node},
            "reportingComponent": "nvidia-driver-installer",
            "reportingInstance": f"nvidia-driver-installer-{node}", "action": "Verify"}


def test_events_about_its_own_node_only(cluster: ControlPlane,
                                        nodes: Callable[..., str]) -> None:
    """A stolen token may not tell the story of another node, nor of its own as another
    reporter: each forgery of the installer's Event is denied, the Event itself admitted."""
    mine, other = nodes(), nodes()
    token = cluster.pod_token(mine)
    uid = cluster.get(f"/api/v1/nodes/{mine}")["metadata"]["uid"]
    other_uid = cluster.get(f"/api/v1/nodes/{other}")["metadata"]["uid"]
    about = f"may post events only about its own node ({mine}), related to nothing else"
    as_ = "may post events only as nvidia-driver-installer on its own node"
    forgeries: list[tuple[dict[str, Any], str]] = [
        ({"involvedObject": {"apiVersion": "v1", "kind": "Node", "name": other,
                             "uid": other_uid}}, about),
        ({"involvedObject": {"apiVersion": "v1", "kind": "Node", "name": mine,
                             "uid": other_uid}}, about),
        ({"involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "gpu-job",
                             "namespace": "default"}}, about),
        ({"involvedObject": {"apiVersion": "v1", "kind": "Node", "name": mine,
                             "namespace": "default"}}, about),
        ({"related": {"apiVersion": "v1", "kind": "Node", "name": other}}, about),
        ({"reportingComponent": "kubelet"}, as_),
        ({"reportingInstance": f"kubelet-{mine}"}, as_),
        ({"source": {"component": "kubelet", "host": mine}}, as_),
        ({"source": {"component": "nvidia-driver-installer", "host": other}}, as_),
        ({"source": {"component": "nvidia-driver-installer"}}, as_),
    ]
    for change, says in forgeries:
        body = {**_installer_event(mine, uid), **change}
        message = _denied(partial(cluster.create, "/api/v1/namespaces/default/events", body,
                                  token=token))
        assert says in message, (change, message)
    assert _events_about(cluster, mine) == [] and _events_about(cluster, other) == []
    posted = cluster.create("/api/v1/namespaces/default/events",
                            _installer_event(mine, uid), token=token)
    assert posted["involvedObject"]["uid"] == uid


def test_an_events_k8s_io_event_is_held_the_same(cluster: ControlPlane,
                                                 nodes: Callable[..., str]) -> None:
    """The shipped roles grant no events.k8s.io; where a wider role does, the policies still
    hold: their rule on core events matches events.k8s.io/v1 too (matchPolicy Equivalent, the
    default), and the server converts such an Event to core/v1 for them."""
    cluster.request("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", {
        "metadata": {"name": "wider-events"},
        "rules": [{"apiGroups": ["events.k8s.io"], "resources": ["events"],
                   "verbs": ["create"]}]})
    cluster.request("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", {
        "metadata": {"name": "wider-events"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "wider-events"},
        "subjects": [{"kind": "ServiceAccount", "name": "nvidia-driver-installer",
                      "namespace": "kube-system"}]})
    try:
        mine, other = nodes(), nodes()
        token = cluster.pod_token(mine)
        body = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"generateName": f"{other}-", "namespace": "default"},
                "regarding": {"apiVersion": "v1", "kind": "Node", "name": other},
                "reason": "DriverVerified", "note": "m", "type": "Normal", "action": "Verify",
                "eventTime": "2026-12-05T12:00:00.000000Z",
                "reportingController": "nvidia-driver-installer",
                "reportingInstance": f"nvidia-driver-installer-{mine}"}
        deadline = time.monotonic() + 30
        while True:  # until the authorizer's cache has the binding
            message = _denied(lambda: cluster.create(
                "/apis/events.k8s.io/v1/namespaces/default/events", body, token=token))
            if "ValidatingAdmissionPolicy" in message:
                break
            assert "cannot create resource" in message and time.monotonic() < deadline, message
            time.sleep(0.2)
        assert f"may post events only about its own node ({mine})" in message
        assert _events_about(cluster, other) == []
    finally:  # the control plane is shared: the wider role goes
        for kind in ("rolebindings", "roles"):
            cluster.request("DELETE", "/apis/rbac.authorization.k8s.io/v1/namespaces/"
                            f"default/{kind}/wider-events")


def test_pods_deleted_only_on_its_own_node(cluster: ControlPlane,
                                           nodes: Callable[..., str]) -> None:
    mine, other = nodes(), nodes()
    token = cluster.pod_token(mine)
    ns, theirs = _pod(cluster, other, f"gpu-job-{other}"[:63])
    _, ours = _pod(cluster, mine, f"gpu-job-{mine}"[:63])
    message = _denied(lambda: cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{theirs}",
                                              token=token))
    assert f"may delete only pods on its own node ({mine})" in message
    assert "deletionTimestamp" not in cluster.get(
        f"/api/v1/namespaces/{ns}/pods/{theirs}")["metadata"]
    # A pod on no node (held by a scheduling gate) is no pod of its node either.
    cluster.create(f"/api/v1/namespaces/{ns}/pods", {
        "metadata": {"name": f"pending-{mine}"[:63]},
        "spec": {"schedulingGates": [{"name": "example.com/hold"}],
                 "containers": [{"name": "c", "image": "gpu:test"}]}})
    message = _denied(lambda: cluster.request(
        "DELETE", f"/api/v1/namespaces/{ns}/pods/" + f"pending-{mine}"[:63], token=token))
    assert f"may delete only pods on its own node ({mine})" in message
    # A token bound to no pod names no node: not even the pods on `mine`.
    unbound = cluster.create("/api/v1/namespaces/kube-system/serviceaccounts/"
                             "nvidia-driver-installer/token",
                             {"spec": {"audiences": [], "expirationSeconds": 600}})
    _denied(lambda: cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{ours}",
                                    token=unbound["status"]["token"]))
    assert "deletionTimestamp" not in cluster.get(
        f"/api/v1/namespaces/{ns}/pods/{ours}")["metadata"]
    # No kubelet: a pod bound to a node stays Terminating after a graceful delete.
    deleted = cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{ours}", token=token)
    assert "deletionTimestamp" in deleted["metadata"]


# --- the upgrade protocol's writes, and who the policies hold ---------------------------------


DENIED_BY = re.compile(r"ValidatingAdmissionPolicy 'nvidia-driver-installer-(own-node|"
                       r"scheduling-gate|driver-version)' with binding "
                       r"'nvidia-driver-installer-\1' denied request: ")


def _begin(node_annotation: str = '{"from":"580.105.08","to":"580.126.20","cordoned":true}'
           ) -> dict[str, Any]:
    """What the upgrade protocol's begin (installer/cluster/protocol.py) merges into its node:
    cordon, its GPU clients paused, the state label and its annotation."""
    return {"spec": {"unschedulable": True},
            "metadata": {"labels": {PLUGIN: PAUSED,
                                    "nvidia.com/gpu.deploy.gpu-feature-discovery": PAUSED,
                                    STATE_LABEL: "draining"},
                         "annotations": {UPGRADE_ANNOTATION: node_annotation}}}


def test_every_write_of_the_upgrade_protocol_on_its_own_node_is_admitted(
        cluster: ControlPlane, nodes: Callable[..., str]) -> None:
    """Begin, a state step and the restore (labels put back or removed, uncordon, the
    annotation removed), each stored as sent."""
    node = nodes()
    token = cluster.pod_token(node)
    stored = patch_node(cluster, node, _begin(), token, MERGE)
    assert stored["spec"]["unschedulable"] is True
    assert stored["metadata"]["labels"][PLUGIN] == PAUSED
    assert stored["metadata"]["annotations"][UPGRADE_ANNOTATION].startswith('{"from"')
    stored = patch_node(cluster, node, {"metadata": {"labels": {STATE_LABEL: "unloading"}}},
                        token, MERGE)
    assert stored["metadata"]["labels"][STATE_LABEL] == "unloading"
    stored = patch_node(cluster, node, {
        "spec": {"unschedulable": None},
        "metadata": {"labels": {PLUGIN: "true",
                                "nvidia.com/gpu.deploy.gpu-feature-discovery": None,
                                STATE_LABEL: "upgrade-done"},
                     "annotations": {UPGRADE_ANNOTATION: None}}}, token, MERGE)
    assert "unschedulable" not in stored["spec"]
    labels = stored["metadata"]["labels"]
    assert labels[PLUGIN] == "true" and labels[STATE_LABEL] == "upgrade-done"
    assert "nvidia.com/gpu.deploy.gpu-feature-discovery" not in labels
    assert UPGRADE_ANNOTATION not in stored["metadata"].get("annotations", {})


def test_another_node_is_denied_whatever_the_change(cluster: ControlPlane,
                                                    nodes: Callable[..., str]) -> None:
    mine, other = nodes(), nodes()
    token = cluster.pod_token(mine)
    before = cluster.get(f"/api/v1/nodes/{other}")
    taints = before["spec"]["taints"]
    for change in ({"spec": {"unschedulable": True}},
                   {"spec": {"taints": [*taints, {"key": "evil", "effect": "NoExecute"}]}},
                   {"metadata": {"labels": {PLUGIN: PAUSED}}}):
        message = _denied(partial(patch_node, cluster, other, change, token, MERGE))
        assert DENIED_BY.search(message), message
        assert (f"may change only the node its pod runs on ({mine}), not {other}"
                in message), (change, message)
    after = cluster.get(f"/api/v1/nodes/{other}")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_a_control_plane_nodes_taints_cannot_be_removed(cluster: ControlPlane,
                                                        nodes: Callable[..., str]) -> None:
    """Not even by a token bound to a pod on that very node."""
    control = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
    node = nodes(taints=control)
    token = cluster.pod_token(node)
    message = _denied(lambda: patch_node(cluster, node, {"spec": {"taints": None}}, token,
                                         MERGE))
    assert "may not add, change or remove taints" in message
    assert "node-role.kubernetes.io/control-plane" in message
    # The server added its own not-ready taint at create; the control plane's stays.
    assert control[0] in cluster.get(f"/api/v1/nodes/{node}")["spec"]["taints"]


def test_a_long_node_names_cut_reporting_instance_is_its_own(
        cluster: ControlPlane, nodes: Callable[..., str]) -> None:
    """The server caps reportingInstance at 128 characters and the installer cuts its own
    there: the cut one is admitted, a shorter cut or another node's is not."""
    node = nodes()
    long_name = node + "-" + "n" * (124 - len(node) - 1)
    # The hostname label is a label value (63 characters at most); the name may be longer.
    cluster.node(long_name, labels={"kubernetes.io/hostname": "long-node"})
    token = cluster.pod_token(long_name)
    uid = cluster.get(f"/api/v1/nodes/{long_name}")["metadata"]["uid"]
    instance = f"nvidia-driver-installer-{long_name}"
    assert len(instance) > 128
    event = _installer_event(long_name, uid)
    event["metadata"]["generateName"] = "long-node."
    for cut, says in ((instance[:127], "may post events only as nvidia-driver-installer"),
                      (f"nvidia-driver-installer-{node}", "may post events only as")):
        message = _denied(partial(cluster.create, "/api/v1/namespaces/default/events",
                                  {**event, "reportingInstance": cut}, token=token))
        assert says in message, (cut, message)
    posted = cluster.create("/api/v1/namespaces/default/events",
                            {**event, "reportingInstance": instance[:128]}, token=token)
    assert posted["reportingInstance"] == instance[:128]


@pytest.mark.parametrize(("namespace", "account"), [
    ("gpu-system", "nvidia-driver-installer"),
    ("kube-system", "prod-nvidia-driver-installer"),
])
def test_the_installers_account_moved_or_renamed_by_kustomize_is_still_held(
        cluster: ControlPlane, namespace: str, account: str) -> None:
    """kustomize's `namespace:` and namePrefix rewrite the ServiceAccount and its RBAC subjects
    but not a username written into CEL: such an account's real token, its role bound, is
    held as the shipped one is."""
    cluster.namespace(namespace)
    cluster.service_account(namespace, account)
    real = RealNodes(cluster, account, namespace=namespace)
    try:
        real.bind(COMPONENTS / "upgrade-protocol" / "rbac.yaml")
        real.wait_allowed("patch", "nodes")
        real.wait_allowed("delete", "pods")
        mine, other = f"moved-{namespace}-{account}"[:50], f"moved-{namespace}-other"
        real.node(mine)
        real.node(other)
        token = real.token(mine)
        assert token_claims(token)["sub"] == f"system:serviceaccount:{namespace}:{account}"
        message = _denied(lambda: patch_node(cluster, other, {"spec": {"unschedulable": True}},
                                             token, MERGE))
        assert f"may change only the node its pod runs on ({mine}), not {other}" in message
        ns, theirs = _pod(cluster, other, f"victim-{other}"[:63])
        message = _denied(lambda: cluster.request(
            "DELETE", f"/api/v1/namespaces/{ns}/pods/{theirs}", token=token))
        assert f"may delete only pods on its own node ({mine})" in message
        stored = patch_node(cluster, mine, _begin(), token, MERGE)
        assert stored["metadata"]["labels"][STATE_LABEL] == "draining"
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{theirs}",
                        {"gracePeriodSeconds": 0})
    finally:
        real.close()


def _as_user(cp: ControlPlane, username: str, method: str, path: str, body: Any,
             content_type: str) -> dict[str, Any]:
    """The request made by the administrator impersonating `username` in system:masters:
    whatever RBAC grants, the policies see that username (and no token claims)."""
    request = urllib.request.Request(cp.url + path, data=json.dumps(body).encode(),
                                     method=method)
    for header, value in (("Content-Type", content_type), ("Accept", "application/json"),
                          ("Impersonate-User", username),
                          ("Impersonate-Group", "system:masters")):
        request.add_header(header, value)
    try:
        with urllib.request.urlopen(request, context=cp._context(True), timeout=30) as answer:
            return dict(json.loads(answer.read()))
    except urllib.error.HTTPError as e:
        raise ApiError(e.code, json.loads(e.read())) from None


@pytest.mark.parametrize("username", [
    "kubernetes-admin",
    "nvidia-driver-installer",  # a user (not a ServiceAccount) of that name
    "system:serviceaccount:gpu-system:gpu-operator",
    "system:serviceaccount:kube-system:node-controller",
    "system:node:gpu-node-2",
])
def test_other_users_are_not_the_policies_business(cluster: ControlPlane,
                                                   nodes: Callable[..., str],
                                                   username: str) -> None:
    """No node claim, another node, a change no feature makes: admitted, because the
    policies' match conditions hold only ServiceAccounts named *nvidia-driver-installer."""
    node = nodes()
    stored = _as_user(cluster, username, "PATCH", f"/api/v1/nodes/{node}", {
        "spec": {"unschedulable": True}, "metadata": {"labels": {"team": "x"}}}, MERGE)
    assert stored["spec"]["unschedulable"] is True
    assert stored["metadata"]["labels"]["team"] == "x"


def test_the_fields_the_installer_writes_are_named_in_one_place() -> None:
    """The place a new field of a feature (as the gate's taint and label did) goes: the own-node
    policy's variables, each key written once."""
    path = COMPONENTS / "upgrade-protocol" / "admission-policy.yaml"
    (own_node,) = [d for d in yaml.safe_load_all(path.read_text())
                   if d and d["metadata"]["name"] == "nvidia-driver-installer-own-node"
                   and d["kind"] == "ValidatingAdmissionPolicy"]
    names = [v["name"] for v in own_node["spec"]["variables"]]
    assert {"upgradeLabels", "upgradeLabelPrefixes", "upgradeAnnotations", "gateLabels",
            "gateTaintKey", "driverLabels", "driverAnnotations", "mayCordon"} <= set(names)
    text = path.read_text()
    assert (text.count(protocol.STATE_LABEL) == 1
            and text.count(protocol.ANNOTATION + "'") == 1)
