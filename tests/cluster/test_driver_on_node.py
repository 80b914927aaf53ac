"""The verified driver on the Node object, against the stand-in API server enforcing
components/cluster-signals' RBAC and admission policies for a token bound to NODE: a run with the
signals on applies `nvidia.com/gpu.present=true`, GPU Feature Discovery's
`nvidia.com/cuda.driver-version.*` labels and the `cuda.driver-version.*` annotations under the
installer's prefix (and GKE's when asked) by server-side apply under its own field manager; a
warm run reads the Node once and writes nothing; a key it stops sending goes away; keys GFD owns
are left to it; another node, another key, or the signals' role missing is refused. Then the
stand-in's apply itself: ownership, conflicts, force, shared keys."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

pytest.importorskip("celpy", reason="pip install cel-python")

from lib.hosttrees import H100, make_host, module_line, write_driver_version, write_proc_modules

from cluster.admission import load_policies
from cluster.apiserver import ApiError, ApiServer, Cluster, cluster_role_rules
from cluster.nodes import NodeHost
from installer import state
from installer.cluster import driver_labels, signals
from installer.cluster.client import DRIVER_VERSION_MANAGER, NodeClient
from installer.components import registry
from installer.errors import ClusterApiForbidden
from installer.hostroot import HostRoot
from installer.layout import READY_FILE

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = REPO / "daemonset" / "components"
SIGNALS = COMPONENTS / "cluster-signals"
PROTOCOL = COMPONENTS / "upgrade-protocol"
NODE, OTHER = "gpu-node-1", "gpu-node-2"
VERSION, KERNEL = "580.105.08", "6.8.0-1015-gcp"
PARTS = (("full", VERSION), ("major", "580"), ("minor", "105"), ("revision", "08"))
GFD_LABELS = {f"nvidia.com/cuda.driver-version.{p}": v for p, v in PARTS}
OWN_ANNOTATIONS = {f"nvidia-driver-installer/cuda.driver-version.{p}": v for p, v in PARTS}
GKE_ANNOTATIONS = {f"cloud.google.com/cuda.driver-version.{p}": v for p, v in PARTS}


@dataclass
class Host(NodeHost):
    switch: ClassVar[str] = "NVIDIA_INSTALLER_CLUSTER_SIGNALS"

    def verified(self, version: str = VERSION) -> None:
        write_proc_modules(self.root, [module_line(n) for n in ("nvidia_uvm", "nvidia")])
        write_driver_version(self.root, version)
        path = HostRoot(self.root).local(READY_FILE)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(state.ready_text(version, "open", "/var/lib/nvidia", KERNEL))

    def run(self, **env: str) -> None:
        """The end of a successful run (signals.Told), as app.run calls it."""
        signals.Told(self.config(**env)).succeeded([], VERSION, 0.1)

    def labels(self) -> dict[str, str]:
        return dict(self.node()["metadata"].get("labels") or {})

    def annotations(self) -> dict[str, str]:
        return dict(self.node()["metadata"].get("annotations") or {})

    def ours(self) -> tuple[set[str], set[str]]:
        owned = driver_labels.applied_keys(self.node())
        assert owned is not None
        return owned


@pytest.fixture(autouse=True)
def driver_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "COMPONENTS", ())


def _cluster(*components: Path) -> Cluster:
    policies = [p for c in components for p in load_policies(c / "admission-policy.yaml")]
    cluster = Cluster(rules=cluster_role_rules(*(c / "rbac.yaml" for c in components)),
                      policies=policies, token_node=NODE)
    cluster.add_node(NODE, {"kubernetes.io/hostname": NODE})
    cluster.add_node(OTHER, {"kubernetes.io/hostname": OTHER})
    return cluster


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Host]:
    root = tmp_path / "host"
    make_host(root, kernel=KERNEL, gpus=[H100])
    with ApiServer(_cluster(SIGNALS)) as server:
        yield Host(server.cluster, server, root, server.kubeconfig(tmp_path))


def test_a_run_applies_the_driver_labels_and_annotations_under_its_own_manager(
        env: Host) -> None:
    env.verified()
    env.run()
    assert env.labels() == {"kubernetes.io/hostname": NODE, driver_labels.PRESENT: "true",
                            **GFD_LABELS}
    assert env.annotations() == OWN_ANNOTATIONS  # GKE's only when asked
    assert env.ours() == ({driver_labels.PRESENT, *GFD_LABELS}, set(OWN_ANNOTATIONS))
    (apply,) = [r for r in env.cluster.writes() if r.path == f"/api/v1/nodes/{NODE}"]
    assert apply.method == "PATCH"
    assert sorted(apply.query.split("&")) == ["fieldManager=" + DRIVER_VERSION_MANAGER,
                                              "force=true"]
    assert apply.body == {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": NODE, "labels": {driver_labels.PRESENT: "true", **GFD_LABELS},
        "annotations": OWN_ANNOTATIONS}}


def test_a_warm_run_reads_the_node_once_and_writes_nothing(env: Host) -> None:
    env.verified()
    env.run()
    before = len(env.cluster.requests)
    env.run()
    after = env.cluster.requests[before:]
    assert [(r.method, r.path) for r in after] == [("GET", f"/api/v1/nodes/{NODE}")]


def test_a_new_version_replaces_the_old_one(env: Host) -> None:
    env.verified()
    env.run()
    env.verified("580.126.20")
    env.run()
    assert env.labels()["nvidia.com/cuda.driver-version.full"] == "580.126.20"
    assert env.labels()["nvidia.com/cuda.driver-version.minor"] == "126"
    assert env.labels()["nvidia.com/cuda.driver-version.revision"] == "20"
    assert env.annotations()["nvidia-driver-installer/cuda.driver-version.full"] == "580.126.20"


def test_gke_annotations_when_asked_and_keys_no_longer_sent_go_away(env: Host) -> None:
    env.verified()
    env.run(NVIDIA_INSTALLER_GKE_DRIVER_ANNOTATIONS="true")
    assert env.annotations() == {**OWN_ANNOTATIONS, **GKE_ANNOTATIONS}
    # GFD deployed since, GKE's annotations no longer asked for: the next run's apply drops
    # them, and keeps gpu.present.
    env.run(NVIDIA_INSTALLER_GPU_FEATURE_DISCOVERY="true")
    assert env.annotations() == OWN_ANNOTATIONS
    assert env.labels() == {"kubernetes.io/hostname": NODE, driver_labels.PRESENT: "true"}
    assert env.ours() == ({driver_labels.PRESENT}, set(OWN_ANNOTATIONS))


def test_with_gfd_running_its_labels_are_left_to_it(env: Host) -> None:
    gfd = {**GFD_LABELS, "nvidia.com/cuda.driver-version.full": "580.105.08"}
    env.cluster.nodes[NODE]["metadata"]["labels"].update(gfd)
    env.cluster.nodes[NODE]["metadata"]["managedFields"] = [{
        "manager": "gpu-feature-discovery", "operation": "Update", "apiVersion": "v1",
        "time": "2026-12-01T00:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in gfd}}}}]
    gfd_entry = dict(env.cluster.nodes[NODE]["metadata"]["managedFields"][0])
    env.verified()
    env.run(NVIDIA_INSTALLER_GPU_FEATURE_DISCOVERY="true")
    assert env.ours() == ({driver_labels.PRESENT}, set(OWN_ANNOTATIONS))
    assert gfd_entry in env.node()["metadata"]["managedFields"]
    assert {k: env.labels()[k] for k in gfd} == gfd


def test_a_version_that_is_no_driver_version_is_not_published(
        env: Host, caplog: pytest.LogCaptureFixture) -> None:
    """The readiness file lies on the node's disk: what it names must look like a version
    before it becomes a label value."""
    env.verified("580.105.08-x")
    env.run()  # not a loaded driver's version: nothing to publish
    assert not driver_labels.publish(env.config(), "580.105.08\nnvidia.com/gpu.present")
    assert not [r for r in env.cluster.writes() if r.path == f"/api/v1/nodes/{NODE}"]
    assert "not publishing driver version '580.105.08\\nnvidia.com/gpu.present'" in \
        caplog.text


@pytest.mark.parametrize(("version", "parts"), [
    ("580.105.08", ("580.105.08", "580", "105", "08")),
    ("470.57", ("470.57", "470", "57", "")),
    ("580", None), ("580.105.08.1", None), ("580.105.08\n", None), ("", None),
    ("580.105.08x", None), ("5800000000.1.1", None),
])
def test_version_parts(version: str, parts: tuple[str, ...] | None) -> None:
    got = driver_labels.version_parts(version)
    assert (None if got is None else tuple(got[p] for p in driver_labels.PARTS)) == parts


def test_a_refusal_is_a_warning_in_a_run(env: Host, caplog: pytest.LogCaptureFixture) -> None:
    env.cluster.rules = [{**r, "verbs": [v for v in r["verbs"] if v == "get"]}
                         if r["resources"] == ["nodes"] else r for r in env.cluster.rules or []]
    env.verified()
    env.run()
    assert driver_labels.PRESENT not in env.labels()
    assert "could not publish driver 580.105.08 on node gpu-node-1" in caplog.text
    assert "cannot patch resource \"nodes\"" in caplog.text


def _apply(env: Host, node: str, labels: dict[str, str],
           annotations: dict[str, str] | None = None) -> None:
    NodeClient(node, str(env.kubeconfig)).apply_node({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": labels, "annotations": annotations or {}}})


@pytest.mark.parametrize(("node", "labels", "annotations", "says"), [
    (OTHER, {driver_labels.PRESENT: "true"}, {}, f"({NODE}), not {OTHER}"),
    (NODE, {driver_labels.PRESENT: "true", "nvidia.com/gpu.product": "H100"}, {},
     "may not change the labels nvidia.com/gpu.product"),
    (NODE, {"nvidia.com/gpu.deploy.device-plugin": "true"}, {},
     "may not change the labels nvidia.com/gpu.deploy.device-plugin"),
    (NODE, {}, {"cloud.google.com/gke-accelerator": "x"},
     "may not change the annotations cloud.google.com/gke-accelerator"),
])
def test_the_token_applies_only_the_driver_keys_on_its_own_node(
        env: Host, node: str, labels: dict[str, str], annotations: dict[str, str],
        says: str) -> None:
    before = env.node(node)
    with pytest.raises(ClusterApiForbidden, match=re.escape(says)):
        _apply(env, node, labels, annotations)
    assert env.node(node) == before


def test_beside_the_upgrade_protocol_every_copy_of_the_node_policy_admits_it(
        tmp_path: Path) -> None:
    root = tmp_path / "host"
    make_host(root, kernel=KERNEL, gpus=[H100])
    with ApiServer(_cluster(SIGNALS, PROTOCOL)) as server:
        host = Host(server.cluster, server, root, server.kubeconfig(tmp_path))
        assert len(server.cluster.policies or []) == 5
        host.verified()
        host.run()
        assert host.labels()[driver_labels.PRESENT] == "true"
        # The protocol's role alone (the signals' not bound): the same apply is refused.
        server.cluster.rules = cluster_role_rules(PROTOCOL / "rbac.yaml")
        with pytest.raises(ClusterApiForbidden, match=re.escape(
                "may not change the labels nvidia.com/cuda.driver-version.full")):
            _apply(host, NODE, {"nvidia.com/cuda.driver-version.full": "1.2.3"})


# --------------------------------------------------------------------------- the stand-in


def _stand_in() -> Cluster:
    cluster = Cluster()
    cluster.add_node(NODE, {"team": "ml"})
    return cluster


def _body(labels: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}}


def test_stand_in_apply_conflicts_force_and_shared_ownership() -> None:
    cluster = _stand_in()
    cluster.apply_node(NODE, _body({"a": "1", "b": "1"}), "one", force=False)
    # The same value from a second applier: shared, no conflict.
    cluster.apply_node(NODE, _body({"a": "1"}), "two", force=False)
    with pytest.raises(ApiError) as caught:
        cluster.apply_node(NODE, _body({"b": "2"}), "two", force=False)
    assert caught.value.code == 409
    assert 'conflict with "one": .metadata.labels.b' in caught.value.message
    cluster.apply_node(NODE, _body({"a": "1", "b": "2"}), "two", force=True)
    assert cluster.node(NODE)["metadata"]["labels"] == {"team": "ml", "a": "1", "b": "2"}
    # "one" lost b to the forced apply, and still shares a: dropping both removes neither.
    cluster.apply_node(NODE, _body({}), "one", force=False)
    assert cluster.node(NODE)["metadata"]["labels"] == {"team": "ml", "a": "1", "b": "2"}
    # "two" is now their only owner: dropping them removes them; a key no applier owns stays.
    cluster.apply_node(NODE, _body({}), "two", force=False)
    assert cluster.node(NODE)["metadata"]["labels"] == {"team": "ml"}


def test_stand_in_an_update_takes_a_key_from_its_applier() -> None:
    cluster = _stand_in()
    cluster.apply_node(NODE, _body({"a": "1"}), "one", force=False)
    cluster.patch_node(NODE, "application/merge-patch+json",
                       {"metadata": {"labels": {"a": "2"}}}, "kubectl-label")
    with pytest.raises(ApiError) as caught:
        cluster.apply_node(NODE, _body({"a": "1"}), "one", force=False)
    assert caught.value.code == 409
    # kubectl-label owns it now: the applier no longer sending it removes nothing.
    cluster.apply_node(NODE, _body({}), "one", force=False)
    assert cluster.node(NODE)["metadata"]["labels"]["a"] == "2"


@pytest.mark.parametrize(("body", "manager", "code"), [
    (_body({"a": "1"}), "", 422),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": NODE}}, "m", 400),
    ({"apiVersion": "v1", "kind": "Node", "metadata": {"name": OTHER}}, "m", 400),
    ({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
      "spec": {"unschedulable": True}}, "m", 415),
    (_body({"a": "not a label value!"}), "m", 422),
])
def test_stand_in_apply_refusals(body: dict, manager: str, code: int) -> None:
    cluster = _stand_in()
    before = cluster.node(NODE)
    with pytest.raises(ApiError) as caught:
        cluster.apply_node(NODE, body, manager, force=True)
    assert caught.value.code == code
    assert cluster.node(NODE) == before
