"""The verified driver on the Node against a real kube-apiserver (tests/lib/controlplane.py,
through tests/lib/apiproxy.py) enforcing components/cluster-signals' RBAC and admission
policies as shipped, for a token from the TokenRequest API bound to a Pod on NODE: a run's
server-side apply under the installer's field manager shows, in what `kubectl get node -o yaml`
prints, `nvidia.com/gpu.present=true`, GPU Feature Discovery's `nvidia.com/cuda.driver-version.*`
labels and the `cuda.driver-version.*` annotations under the installer's prefix (GKE's only when
asked), with managedFields naming the installer's manager; a new version replaces them; with GFD
on, exactly GFD's labels go (and stay where GFD itself applied them); any other key, or any key
of another node, is refused by the real server, and so is the signals' key with only the upgrade
protocol's role bound; a warm run only reads the Node; a version that is none is not published;
an RBAC refusal is a warning in a run."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from lib.controlplane import ControlPlane, token_claims
from lib.hosttrees import H100, make_host, write_verified
from lib.realcluster import OnRealNodes, apply_policies, component_nodes

from installer.cluster import driver_labels, signals
from installer.cluster.client import DRIVER_VERSION_MANAGER, NodeClient
from installer.config import Config, build_config
from installer.errors import ClusterApiForbidden

REPO = Path(__file__).resolve().parents[2]
SIGNALS = REPO / "daemonset" / "components" / "cluster-signals"
PROTOCOL = REPO / "daemonset" / "components" / "upgrade-protocol"
NODE, OTHER = "dvr-node-1", "dvr-node-2"
VERSION, KERNEL = "580.105.08", "6.8.0-1015-gcp"
POLICY = "nvidia-driver-installer-driver-version"


def parts(version: str) -> dict[str, str]:
    major, minor, *revision = version.split(".")
    return {"full": version, "major": major, "minor": minor,
            "revision": revision[0] if revision else ""}


def gfd_labels(version: str = VERSION) -> dict[str, str]:
    return {f"nvidia.com/cuda.driver-version.{p}": v for p, v in parts(version).items()}


def own_annotations(version: str = VERSION) -> dict[str, str]:
    return {f"nvidia-driver-installer/cuda.driver-version.{p}": v
            for p, v in parts(version).items()}


def gke_annotations(version: str = VERSION) -> dict[str, str]:
    return {f"cloud.google.com/cuda.driver-version.{p}": v for p, v in parts(version).items()}


@dataclass
class OnNode(OnRealNodes):
    root: Path
    kubeconfig: Path

    def config(self, **env: str) -> Config:
        return build_config({"NVIDIA_INSTALLER_CLUSTER_SIGNALS": "true", "NODE_NAME": NODE,
                             "NVIDIA_INSTALLER_KUBECONFIG": str(self.kubeconfig),
                             "ROOT_MOUNT_DIR": str(self.root),
                             "NVIDIA_INSTALL_DIR_CONTAINER": str(self.root / "no-mount"),
                             **env}, {})

    def verified(self, version: str = VERSION) -> None:
        """What a passing verify leaves: the modules loaded and the readiness file."""
        write_verified(self.root, version, KERNEL)

    def run(self, version: str = VERSION, **env: str) -> None:
        """The end of a successful run (signals.Told), as app.run calls it."""
        self.verified(version)
        signals.Told(self.config(**env)).succeeded([], version, 0.1)

    def kubectl_node(self, name: str = NODE) -> dict[str, Any]:
        """The Node as an administrator sees it with the built kubectl (managedFields are
        hidden from -o yaml unless asked for)."""
        done = self.cp.apply("get", "node", name, "-o", "yaml", "--show-managed-fields")
        assert done.returncode == 0, done.stderr
        node = yaml.safe_load(done.stdout)
        assert isinstance(node, dict)
        return node

    def node_writes(self, name: str = NODE) -> list[str]:
        """The installer's writes to the Node object itself (not its status), with query."""
        return [f"{s.method} {s.path}" for s in self.proxy.writes()
                if s.path.split("?")[0] == f"/api/v1/nodes/{name}"]


def labels_of(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("labels") or {})


def annotations_of(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("annotations") or {})


def manager_entries(node: dict[str, Any], manager: str) -> list[dict[str, Any]]:
    return [e for e in node["metadata"].get("managedFields") or []
            if e.get("manager") == manager]


def owned(node: dict[str, Any], manager: str = DRIVER_VERSION_MANAGER
          ) -> tuple[set[str], set[str]]:
    """The label and annotation keys `manager`'s Apply entry owns (the server's own record)."""
    (entry,) = [e for e in manager_entries(node, manager) if e["operation"] == "Apply"]
    meta = entry["fieldsV1"]["f:metadata"]
    return ({k[2:] for k in meta.get("f:labels", {})},
            {k[2:] for k in meta.get("f:annotations", {})})


pytestmark = pytest.mark.usefixtures("driver_readiness_only")


@pytest.fixture
def env(control_plane: ControlPlane, tmp_path: Path) -> Iterator[OnNode]:
    with component_nodes(control_plane, tmp_path, SIGNALS) as (real, proxy):
        real.wait_allowed("patch", "nodes")
        real.wait_allowed("publish-driver-version", "nodes")
        real.node(NODE, labels={"team": "ml"})
        real.node(OTHER)
        root = tmp_path / "host"
        make_host(root, kernel=KERNEL, gpus=[H100])
        token = real.token(NODE)
        assert token_claims(token)["kubernetes.io"]["node"]["name"] == NODE
        yield OnNode(real, proxy, root, proxy.kubeconfig(tmp_path / "kubeconfig", token))


def test_a_run_applies_the_labels_and_annotations_kubectl_shows_under_its_manager(
        env: OnNode) -> None:
    before = env.kubectl_node()
    env.run()
    node = env.kubectl_node()
    assert labels_of(node) == {**labels_of(before), driver_labels.PRESENT: "true", **gfd_labels()}
    assert labels_of(node)["team"] == "ml"  # a label the installer never sent stays
    # GKE's annotation shape under the installer's own prefix; cloud.google.com/ only if asked.
    assert annotations_of(node) == {**annotations_of(before), **own_annotations()}
    assert not [k for k in annotations_of(node) if k.startswith("cloud.google.com/")]
    # The server's record: an Apply entry of the installer's manager owning exactly these keys
    # (and none of the others).
    (entry,) = [e for e in manager_entries(node, DRIVER_VERSION_MANAGER)
                if e["operation"] == "Apply"]
    assert entry["apiVersion"] == "v1" and "subresource" not in entry
    assert owned(node) == ({driver_labels.PRESENT, *gfd_labels()}, set(own_annotations()))
    assert driver_labels.applied_keys(node) == owned(node)
    # One server-side apply, forced, under that manager.
    (write,) = env.node_writes()
    path, _, query = write.partition("?")
    assert path == f"PATCH /api/v1/nodes/{NODE}"
    assert sorted(query.split("&")) == [f"fieldManager={DRIVER_VERSION_MANAGER}", "force=true"]


def test_a_warm_run_writes_nothing_to_the_node(env: OnNode) -> None:
    env.run()
    resource_version = env.kubectl_node()["metadata"]["resourceVersion"]
    writes = len(env.node_writes())
    env.run()
    assert len(env.node_writes()) == writes
    assert env.kubectl_node()["metadata"]["resourceVersion"] == resource_version


@pytest.mark.parametrize("new", ["580.126.20", "470.57"])
def test_a_new_version_replaces_every_key(env: OnNode, new: str) -> None:
    env.run()
    env.run(new)
    node = env.kubectl_node()
    assert {k: labels_of(node)[k] for k in gfd_labels(new)} == gfd_labels(new)
    assert {k: v for k, v in annotations_of(node).items()
            if k.startswith("nvidia-driver-installer/")} == own_annotations(new)
    assert labels_of(node)[driver_labels.PRESENT] == "true"
    # 470.57 has no revision: GFD's empty label value, which the server takes as a value.
    assert labels_of(node)["nvidia.com/cuda.driver-version.revision"] == parts(new)["revision"]
    assert owned(node) == ({driver_labels.PRESENT, *gfd_labels()}, set(own_annotations()))


def test_gke_annotations_only_when_asked_and_gone_when_no_longer(env: OnNode) -> None:
    env.run()
    assert not [k for k in annotations_of(env.kubectl_node()) if k.startswith("cloud.google.com/")]
    env.run(NVIDIA_INSTALLER_GKE_DRIVER_ANNOTATIONS="true")
    node = env.kubectl_node()
    assert {k: v for k, v in annotations_of(node).items()
            if "cuda.driver-version" in k} == {**own_annotations(), **gke_annotations()}
    assert owned(node)[1] == {*own_annotations(), *gke_annotations()}
    env.run()
    node = env.kubectl_node()
    assert not [k for k in annotations_of(node) if k.startswith("cloud.google.com/")]
    assert owned(node)[1] == set(own_annotations())


def test_gfd_mode_drops_exactly_gfds_labels(env: OnNode) -> None:
    env.run()
    before = env.kubectl_node()
    env.run(NVIDIA_INSTALLER_GPU_FEATURE_DISCOVERY="true")
    node = env.kubectl_node()
    assert labels_of(node) == {k: v for k, v in labels_of(before).items() if k not in gfd_labels()}
    assert labels_of(node)[driver_labels.PRESENT] == "true"
    assert annotations_of(node) == annotations_of(before)
    assert owned(node) == ({driver_labels.PRESENT}, set(own_annotations()))


def test_gfd_mode_leaves_the_labels_gfd_itself_applied(env: OnNode) -> None:
    """GPU Feature Discovery applying the same values shares them with the installer; when the
    installer stops sending them, the server keeps them for GFD (its own entry untouched)."""
    env.run()
    gfd = env.cp.apply("apply", "--server-side", "--field-manager=gpu-feature-discovery",
                       "-f", "-", stdin=json.dumps({
                           "apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": NODE, "labels": gfd_labels()}}))
    assert gfd.returncode == 0, gfd.stderr
    env.run(NVIDIA_INSTALLER_GPU_FEATURE_DISCOVERY="true")
    node = env.kubectl_node()
    assert {k: labels_of(node)[k] for k in gfd_labels()} == gfd_labels()
    assert owned(node) == ({driver_labels.PRESENT}, set(own_annotations()))
    assert owned(node, "gpu-feature-discovery") == (set(gfd_labels()), set())


def _refused(env: OnNode, node: str, body_labels: dict[str, str],
             body_annotations: dict[str, str], says: str) -> None:
    """The installer's own apply, with the node's token, refused by the shipped policy (its
    message, or its static message where the server cannot evaluate the messageExpression),
    and the Node as it was."""
    before = env.kubectl_node(node)
    with pytest.raises(ClusterApiForbidden) as refused:
        NodeClient(node, str(env.kubeconfig)).apply_node({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": body_labels,
                         "annotations": body_annotations}})
    assert "403" in refused.value.message and "'nvidia-driver-installer-" in refused.value.message
    assert re.search(says, refused.value.message), refused.value.message
    after = env.kubectl_node(node)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert (labels_of(after), annotations_of(after)) == (labels_of(before), annotations_of(before))


ANY_LABEL = "may change only the labels its features write"
ANY_ANNOTATION = "may change only the annotations its features write"


@pytest.mark.parametrize(("extra_labels", "extra_annotations", "says"), [
    ({"nvidia.com/gpu.product": "H100"}, {},
     rf"may not change the labels nvidia\.com/gpu\.product|{ANY_LABEL}"),
    # The upgrade protocol's keys: not the signals' role's.
    ({"nvidia.com/gpu.deploy.device-plugin": "false"}, {},
     rf"may not change the labels nvidia\.com/gpu\.deploy\.device-plugin|{ANY_LABEL}"),
    ({"nvidia-driver-installer/upgrade-state": "draining"}, {},
     rf"may not change the labels nvidia-driver-installer/upgrade-state|{ANY_LABEL}"),
    ({"team": "other"}, {}, rf"may not change the labels team|{ANY_LABEL}"),
    ({}, {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
     rf"may not change the annotations cloud\.google\.com/gke-accelerator|{ANY_ANNOTATION}"),
    ({}, {"nvidia-driver-installer/upgrade": "{}"},
     rf"may not change the annotations nvidia-driver-installer/upgrade|{ANY_ANNOTATION}"),
])
def test_any_other_key_on_its_own_node_is_refused(
        env: OnNode, extra_labels: dict[str, str], extra_annotations: dict[str, str],
        says: str) -> None:
    """Beside the driver's own keys, any other key in the same apply refuses all of it."""
    _refused(env, NODE, {driver_labels.PRESENT: "true", **gfd_labels(), **extra_labels},
             {**own_annotations(), **extra_annotations}, says)


def test_the_driver_keys_of_another_node_are_refused(env: OnNode) -> None:
    _refused(env, OTHER, {driver_labels.PRESENT: "true", **gfd_labels()}, own_annotations(),
             re.escape(f"may change only the node its pod runs on ({NODE}), not {OTHER}"))
    _refused(env, OTHER, {}, gke_annotations(),
             re.escape(f"may change only the node its pod runs on ({NODE}), not {OTHER}"))


def test_another_key_by_merge_patch_is_refused_too(env: OnNode) -> None:
    """Not only through apply: the signals' role may patch nodes, and the policy holds any
    patch to the driver's keys."""
    before = env.kubectl_node()
    with pytest.raises(ClusterApiForbidden, match=f"may not change the labels team|{ANY_LABEL}"):
        NodeClient(NODE, str(env.kubeconfig)).patch_node({"metadata": {"labels": {
            "team": None}}})
    assert labels_of(env.kubectl_node()) == labels_of(before)


def test_a_warm_run_only_reads_the_node_once(env: OnNode) -> None:
    env.run()
    before = len(env.proxy.seen)
    env.run()
    node_requests = [(s.method, s.path.split("?")[0]) for s in env.proxy.seen[before:]
                     if s.path.split("?")[0].startswith(f"/api/v1/nodes/{NODE}")]
    assert node_requests == [("GET", f"/api/v1/nodes/{NODE}")]


def test_a_version_that_is_no_driver_version_is_not_published(
        env: OnNode, caplog: pytest.LogCaptureFixture) -> None:
    """The readiness file lies on the node's disk: what it names must look like a version
    before it becomes a label value."""
    before = env.kubectl_node()
    env.run("580.105.08-x")
    seen = len(env.proxy.seen)
    assert not driver_labels.publish(env.config(), "580.105.08\nnvidia.com/gpu.present")
    assert env.proxy.seen[seen:] == []  # refused before any request
    assert env.node_writes() == []
    assert labels_of(env.kubectl_node()) == labels_of(before)
    assert "not publishing driver version '580.105.08\\nnvidia.com/gpu.present'" in caplog.text


@pytest.mark.parametrize(("version", "version_parts"), [
    ("580.105.08", ("580.105.08", "580", "105", "08")),
    ("470.57", ("470.57", "470", "57", "")),
    ("580", None), ("580.105.08.1", None), ("580.105.08\n", None), ("", None),
    ("580.105.08x", None), ("5800000000.1.1", None),
])
def test_version_parts(version: str, version_parts: tuple[str, ...] | None) -> None:
    got = driver_labels.version_parts(version)
    assert (None if got is None else tuple(got[p] for p in driver_labels.PARTS)) == version_parts


def test_a_refusal_is_a_warning_in_a_run(env: OnNode, caplog: pytest.LogCaptureFixture) -> None:
    """The signals' role taken away and only `get` on nodes left: the server's RBAC refuses
    the apply, the run goes on with a warning, and the Node is as it was."""
    env.real.unbind()
    role = f"get-nodes-{env.real.account}"
    env.cp.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "metadata": {"name": role},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]})
    binding = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    env.cp.create(binding, {
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": env.real.account,
                      "namespace": env.real.namespace}]})
    env.real.bindings += [f"{binding}/{role}", f"/apis/rbac.authorization.k8s.io/v1/"
                                               f"clusterroles/{role}"]
    env.real.wait_allowed("patch", "nodes", allowed=False)
    env.real.wait_allowed("get", "nodes")
    before = env.kubectl_node()
    env.run()
    assert labels_of(env.kubectl_node()) == labels_of(before)
    assert f"could not publish driver {VERSION} on node {NODE}" in caplog.text
    assert 'cannot patch resource "nodes"' in caplog.text
    (refused,) = env.node_writes()
    assert refused.startswith(f"PATCH /api/v1/nodes/{NODE}?")
    assert [s.status for s in env.proxy.writes()
            if s.path.split("?")[0] == f"/api/v1/nodes/{NODE}"] == [403]


def test_beside_the_upgrade_protocol_every_copy_of_the_node_policy_admits_it(
        env: OnNode, control_plane: ControlPlane) -> None:
    """Both Components deployed: every copy of the shared node policy (the protocol's
    own-node and the signals' driver-version) judges the apply, and all admit it; with the
    protocol's role alone bound, the same keys are refused."""
    apply_policies(control_plane, PROTOCOL / "admission-policy.yaml")
    env.real.bind(PROTOCOL / "rbac.yaml")
    env.real.wait_allowed("delete", "pods")
    env.run()
    assert labels_of(env.kubectl_node())[driver_labels.PRESENT] == "true"
    env.real.unbind()
    env.real.bind(PROTOCOL / "rbac.yaml")
    env.real.wait_allowed("publish-driver-version", "nodes", allowed=False)
    env.real.wait_allowed("patch", "nodes")
    _refused(env, NODE, {"nvidia.com/cuda.driver-version.full": "1.2.3"}, {},
             # The apply also drops the keys of the first run: all are named, in the order
             # the server's CEL walked them.
             r"may not change the labels [^(]*nvidia\.com/cuda\.driver-version\.full[^(]* "
             r"without the cluster signals' role")
