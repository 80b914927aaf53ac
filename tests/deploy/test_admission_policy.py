"""The shipped ValidatingAdmissionPolicy's CEL (cel-python) against admission requests shaped as
the API server sends them for the installer's pod-bound ServiceAccount token: every write the
upgrade protocol makes on its own node is admitted; what a stolen node token could do before
the policy (cordon and taint another node, strip a control-plane node's taints, delete a pod
elsewhere) is denied, and so are fields the protocol never writes. The policy's `authorizer`
answers from the protocol's RBAC (its role bound, the scheduling gate's not). The installer
drains its node by deleting pods because a DELETE carries the pod (its node) and can be held to
the token's node here; an Eviction cannot, and the role grants none."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

pytest.importorskip("celpy", reason="pip install cel-python")

from cluster.admission import (
    NODE_UID,
    Authorizer,
    Denied,
    check,
    load_policies,
    rbac_authorizer,
    request,
    user_info,
)
from cluster.apiserver import cluster_role_rules

from deploy.manifests import DAEMONSET_DIR
from installer.cluster import protocol

POLICY = DAEMONSET_DIR / "components" / "upgrade-protocol" / "admission-policy.yaml"
POLICIES = load_policies(POLICY)
PROTOCOL_ROLE = rbac_authorizer(cluster_role_rules(
    DAEMONSET_DIR / "components" / "upgrade-protocol" / "rbac.yaml"))
ME, OTHER = "gpu-node-1", "gpu-node-2"
TOKEN = user_info(node=ME)


def node(name: str = ME) -> dict[str, Any]:
    """A Node as the API server holds it (what `oldObject` is)."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": "9c1e", "resourceVersion": "4711",
                     "labels": {"kubernetes.io/hostname": name,
                                "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
                                "nvidia.com/gpu.deploy.device-plugin": "true"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": "10.4.1.0/24", "podCIDRs": ["10.4.1.0/24"],
                 "providerID": f"gce://proj/us-central1-a/{name}",
                 "taints": [{"key": "nvidia.com/gpu", "value": "present",
                             "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def update(old: dict[str, Any], change: Any, user: dict[str, Any] = TOKEN,
           authorizer: Authorizer = PROTOCOL_ROLE) -> Denied | None:
    new = copy.deepcopy(old)
    change(new)
    return check(POLICIES, request("UPDATE", "nodes", old["metadata"]["name"], user, obj=new,
                                   old=old), authorizer)


def begin(n: dict[str, Any]) -> None:
    """What protocol._begin's merge patch makes of the node."""
    n["spec"]["unschedulable"] = True
    n["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] = protocol.PAUSED
    n["metadata"]["labels"]["nvidia.com/gpu.deploy.gpu-feature-discovery"] = protocol.PAUSED
    n["metadata"]["labels"][protocol.STATE_LABEL] = "draining"
    n["metadata"]["annotations"][protocol.ANNOTATION] = json.dumps(
        {"from": "580.105.08", "to": "580.126.20", "cordoned": True, "labels": {}})


def own_event(**change: Any) -> dict[str, Any]:
    """An Event as installer.cluster.client.NodeClient.event posts it (the Node's uid: the one
    the token's node claim carries), changed."""
    event = {"apiVersion": "v1", "kind": "Event",
             "metadata": {"name": f"{ME}.1", "namespace": "default"},
             "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": ME,
                                "uid": NODE_UID},
             "reason": "DriverUpgradeStarted", "message": "m", "type": "Normal",
             "source": {"component": "nvidia-driver-installer", "host": ME},
             "reportingComponent": "nvidia-driver-installer",
             "reportingInstance": f"nvidia-driver-installer-{ME}", "action": "Upgrade"}
    event.update(change)
    return event


def test_every_write_of_the_protocol_on_its_own_node_is_admitted() -> None:
    old = node()
    assert update(old, begin) is None
    during = copy.deepcopy(old)
    begin(during)

    def restore(n: dict[str, Any]) -> None:
        n["spec"].pop("unschedulable")
        n["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] = "true"
        del n["metadata"]["labels"]["nvidia.com/gpu.deploy.gpu-feature-discovery"]
        n["metadata"]["labels"][protocol.STATE_LABEL] = "upgrade-done"
        del n["metadata"]["annotations"][protocol.ANNOTATION]

    assert update(during, restore) is None
    assert update(during, lambda n: n["metadata"]["labels"].update(
        {protocol.STATE_LABEL: "unloading"})) is None
    assert check(POLICIES, request("CREATE", "events", f"{ME}.1", TOKEN, namespace="default",
                                   obj=own_event()), PROTOCOL_ROLE) is None
    pod = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {"nodeName": ME}}
    assert check(POLICIES, request("DELETE", "pods", "train", TOKEN, namespace="ml",
                                   old=pod), PROTOCOL_ROLE) is None


@pytest.mark.parametrize(("what", "change"), [
    ("cordon", lambda n: n["spec"].update(unschedulable=True)),
    ("NoExecute taint", lambda n: n["spec"]["taints"].append(
        {"key": "evil", "effect": "NoExecute"})),
    ("pause its GPU clients", lambda n: n["metadata"]["labels"].update(
        {"nvidia.com/gpu.deploy.device-plugin": protocol.PAUSED})),
])
def test_another_node_is_denied_whatever_the_change(what: str, change: Any) -> None:
    denied = update(node(OTHER), change)
    assert denied is not None and denied.code == 403, what
    assert (f"may change only the node its pod runs on ({ME}), not {OTHER}"
            in denied.message)
    assert denied.message.startswith("ValidatingAdmissionPolicy "
                                     "'nvidia-driver-installer-own-node' with binding "
                                     "'nvidia-driver-installer-own-node' denied request: ")


def test_a_control_plane_nodes_taints_cannot_be_removed() -> None:
    control = node("control-plane-1")
    control["spec"]["taints"] = [{"key": "node-role.kubernetes.io/control-plane",
                                  "effect": "NoSchedule"}]
    assert update(control, lambda n: n["spec"].pop("taints")) is not None


@pytest.mark.parametrize(("what", "change", "message"), [
    ("taint", lambda n: n["spec"]["taints"].append({"key": "evil", "effect": "NoExecute"}),
     "may not add, change or remove taints"),
    ("untaint", lambda n: n["spec"].pop("taints"), "may not add, change or remove taints"),
    ("other label", lambda n: n["metadata"]["labels"].update({"team": "x"}), "labels"),
    ("remove label", lambda n: n["metadata"]["labels"].pop("kubernetes.io/hostname"),
     "labels"),
    ("other annotation", lambda n: n["metadata"]["annotations"].update({"x": "y"}),
     "annotation"),
    ("podCIDR", lambda n: n["spec"].update(podCIDR="10.9.9.0/24"), "spec.unschedulable"),
    ("providerID", lambda n: n["spec"].pop("providerID"), "spec.unschedulable"),
    ("finalizer", lambda n: n["metadata"].update(finalizers=["x/hold"]), "finalizers"),
])
def test_on_its_own_node_only_the_protocols_fields(what: str, change: Any,
                                                   message: str) -> None:
    denied = update(node(), change)
    assert denied is not None and denied.code == 403, what
    assert message in denied.message, denied.message


def test_a_token_without_a_node_claim_writes_nothing() -> None:
    denied = update(node(), begin, user=user_info(node=None))
    assert denied is not None and "the token carries no node claim" in denied.message


def test_other_users_are_not_this_policys_business() -> None:
    admin = user_info("kubernetes-admin", node=None)
    assert update(node(OTHER), lambda n: n["spec"].update(unschedulable=True),
                  user=admin) is None


def test_pods_and_events_of_other_nodes_are_denied() -> None:
    pod = {"metadata": {"name": "coredns-1", "namespace": "kube-system"},
           "spec": {"nodeName": OTHER}}
    denied = check(POLICIES, request("DELETE", "pods", "coredns-1", TOKEN,
                                     namespace="kube-system", old=pod), PROTOCOL_ROLE)
    assert denied is not None and f"only pods on its own node ({ME})" in denied.message
    assert denied.code == 403
    unscheduled = {"metadata": {"name": "pending-1", "namespace": "ml"}, "spec": {}}
    assert check(POLICIES, request("DELETE", "pods", "pending-1", TOKEN, namespace="ml",
                                   old=unscheduled), PROTOCOL_ROLE) is not None
    assert check(POLICIES, request("DELETE", "pods", "train", user_info(node=None),
                                   namespace="ml", old={**pod, "spec": {"nodeName": ME}}),
                 PROTOCOL_ROLE) is not None
    event = {"involvedObject": {"kind": "Node", "name": OTHER}, "reason": "Forged"}
    denied = check(POLICIES, request("CREATE", "events", "x", TOKEN, namespace="default",
                                     obj=event))
    assert denied is not None and "events only about its own node" in denied.message


LONG = "gpu-" + "n" * 120  # a node name of 124 characters: reportingInstance cut at 128


@pytest.mark.parametrize(("change", "says"), [
    ({"reportingComponent": "kubelet"}, "only as nvidia-driver-installer on its own node"),
    ({"reportingInstance": f"kubelet-{ME}"}, "reportingInstance: nvidia-driver-installer-"),
    ({"source": {"component": "kubelet", "host": ME}}, "source.component"),
    ({"source": {"component": "nvidia-driver-installer", "host": OTHER}}, f"source.host: {ME}"),
    ({"related": {"apiVersion": "v1", "kind": "Pod", "namespace": "kube-system",
                  "name": "coredns-1"}}, "related to nothing else"),
    ({"involvedObject": {"apiVersion": "v1", "kind": "Node", "name": ME,
                         "uid": "0000-another-node"}}, "only about its own node"),
])
def test_the_protocols_events_carry_its_own_source_and_nothing_else(change: dict[str, Any],
                                                                    says: str) -> None:
    """A stolen token may not post as the kubelet, as another node's installer, or about
    another object through `related`."""
    denied = check(POLICIES, request("CREATE", "events", "x", TOKEN, namespace="default",
                                     obj=own_event(**change)), PROTOCOL_ROLE)
    assert denied is not None and denied.code == 403 and says in denied.message, denied


def test_a_long_node_names_cut_reporting_instance_is_its_own() -> None:
    long_token = user_info(node=LONG)
    instance = f"nvidia-driver-installer-{LONG}"
    assert len(instance) > 128
    event = own_event(involvedObject={"kind": "Node", "name": LONG, "uid": NODE_UID},
                      source={"component": "nvidia-driver-installer", "host": LONG})
    for cut, admitted in ((instance[:128], True), (instance[:127], False),
                          (f"nvidia-driver-installer-{ME}", False)):
        event["reportingInstance"] = cut
        denied = check(POLICIES, request("CREATE", "events", "x", long_token,
                                         namespace="default", obj=event), PROTOCOL_ROLE)
        assert (denied is None) is admitted, (cut, denied)


def test_the_fields_the_installer_writes_are_named_in_one_place() -> None:
    """The place a new field of a feature (as the gate's taint and label did) goes."""
    (own_node,) = [p for p, _ in POLICIES
                   if p["metadata"]["name"] == "nvidia-driver-installer-own-node"]
    names = [v["name"] for v in own_node["spec"]["variables"]]
    assert {"upgradeLabels", "upgradeLabelPrefixes", "upgradeAnnotations", "gateLabels",
            "gateTaintKey", "driverLabels", "driverAnnotations", "mayCordon"} <= set(names)
    text = POLICY.read_text()
    assert text.count(protocol.STATE_LABEL) == 1 and text.count(protocol.ANNOTATION + "'") == 1


# kustomize's `namespace:` and namePrefix rewrite the ServiceAccount and its RBAC subjects but not
# a username written into CEL, so the policy must still hold its token there.
@pytest.mark.parametrize("username", [
    "system:serviceaccount:gpu-system:nvidia-driver-installer",
    "system:serviceaccount:kube-system:prod-nvidia-driver-installer",
])
def test_the_installers_account_moved_or_renamed_by_kustomize_is_still_held(
        username: str) -> None:
    moved = user_info(username, node=ME)
    assert update(node(), begin, user=moved) is None
    denied = update(node(OTHER), lambda n: n["spec"].update(unschedulable=True), user=moved)
    assert denied is not None and denied.code == 403
    assert f"may change only the node its pod runs on ({ME}), not {OTHER}" in denied.message
    pod = {"metadata": {"name": "coredns-1", "namespace": "kube-system"},
           "spec": {"nodeName": OTHER}}
    assert check(POLICIES, request("DELETE", "pods", "coredns-1", moved,
                                   namespace="kube-system", old=pod), PROTOCOL_ROLE) is not None


@pytest.mark.parametrize("username", [
    "kubernetes-admin",
    "nvidia-driver-installer",  # a user (not a ServiceAccount) of that name
    "system:serviceaccount:gpu-system:gpu-operator",
    "system:serviceaccount:kube-system:node-controller",
    "system:node:gpu-node-2",
])
def test_other_accounts_anywhere_are_not_held(username: str) -> None:
    other = user_info(username, node=None)
    assert update(node(OTHER), lambda n: n["spec"].update(unschedulable=True),
                  user=other) is None
