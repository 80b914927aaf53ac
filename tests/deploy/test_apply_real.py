"""Every kustomization (overlays and examples) and the Helm chart's render applied with
`kubectl apply --server-side` to a real kube-apiserver (tests/lib/controlplane.py): the server's
own schemas, defaulting, field ownership and admission judge them, not a schema package. And the
DaemonSet as shipped, applied for real: kube-controller-manager's DaemonSet controller creates a
pod for each GPU node only, kube-scheduler binds each to its node, and with the node agent
(tests/lib/nodeagent.py) doing the kubelet's part the DaemonSet counts them ready."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from lib.controlplane import ControlPlane
from lib.manifests import CRD_GROUPS, DAEMONSET_DIR, kustomization_dirs
from lib.nodeagent import NodeAgent

from deploy.test_helm_chart import CASES, chart_render

KUSTOMIZATIONS = kustomization_dirs()


def server_side(cp: ControlPlane, docs: list[dict[str, Any]], *extra: str) -> str:
    # The Prometheus Operator's kinds need its CRDs, which a bare control plane lacks
    # (tests/deploy/test_metrics_manifests.py checks those objects).
    kept = [d for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)]
    # Forced: other tests of the session applied the same objects (the shipped policies) under
    # another field manager; what is judged here is whether the server accepts them.
    done = cp.apply("apply", "--server-side", "--force-conflicts", "--field-manager=test",
                    "-f", "-", *extra,
                    stdin=yaml.safe_dump_all(kept))
    assert done.returncode == 0, done.stderr
    return done.stdout


def kustomize(cp: ControlPlane, directory: Path) -> list[dict[str, Any]]:
    done = cp.apply("kustomize", str(directory))
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.mark.parametrize("directory", KUSTOMIZATIONS,
                         ids=[str(p.relative_to(DAEMONSET_DIR)) for p in KUSTOMIZATIONS])
def test_every_kustomization_applies_server_side(control_plane: ControlPlane,
                                                 directory: Path) -> None:
    docs = kustomize(control_plane, directory)
    out = server_side(control_plane, docs, "--dry-run=server")
    applied = {line.split()[0] for line in out.splitlines() if line.strip()}
    expected = {f"{d['kind'].lower()}.{d['apiVersion'].split('/')[0]}"
                if "/" in d["apiVersion"] else d["kind"].lower()
                for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)}
    assert {a.split("/")[0] for a in applied} == expected


@pytest.mark.parametrize(("name", "values"), [(c[0], c[1]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_charts_render_applies_server_side(control_plane: ControlPlane, name: str,
                                               values: dict[str, Any]) -> None:
    docs = chart_render(values)
    out = server_side(control_plane, docs, "--dry-run=server")
    assert "daemonset.apps/nvidia-driver-installer serverside-applied (server dry run)" in out


def test_a_broken_object_is_refused(control_plane: ControlPlane) -> None:
    """What makes the applies above mean something: the server refuses a DaemonSet its own
    validation rejects (a selector that does not match the template's labels)."""
    docs = kustomize(control_plane, DAEMONSET_DIR / "overlays" / "ubuntu")
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    ds["spec"]["template"]["metadata"]["labels"] = {"k8s-app": "something-else"}
    done = control_plane.apply("apply", "--server-side", "--dry-run=server", "-f", "-",
                               stdin=yaml.safe_dump(ds))
    assert done.returncode != 0
    assert "`selector` does not match template `labels`" in done.stderr


def test_the_daemonset_controller_creates_a_pod_per_gpu_node_and_the_scheduler_binds_it(
        control_plane: ControlPlane) -> None:
    cp = control_plane
    gpu = ["ds-gpu-1", "ds-gpu-2"]
    for name in gpu:
        cp.node(name, labels={"cloud.google.com/gke-accelerator": "nvidia-l4"},
                taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    cp.node("ds-cpu-1")
    cp.node("ds-gke-managed", labels={"cloud.google.com/gke-accelerator": "nvidia-l4",
                                      "cloud.google.com/gke-gpu-driver-version": "default"})
    docs = kustomize(cp, DAEMONSET_DIR / "overlays" / "ubuntu")
    server_side(cp, docs)
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    ns, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
    selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())
    deadline = time.monotonic() + 90
    while True:
        pods = cp.get(f"/api/v1/namespaces/{ns}/pods",
                      query={"labelSelector": selector})["items"]
        bound = {p["spec"].get("nodeName") for p in pods} - {None}
        if bound >= set(gpu):
            break
        assert time.monotonic() < deadline, [(p["metadata"]["name"], p["spec"].get("nodeName"),
                                              p["status"]) for p in pods]
        time.sleep(0.5)
    # Every GPU node, and no other of these: the CPU node and the node whose driver GKE manages
    # get none.
    ours = {p["spec"]["nodeName"] for p in pods} & {*gpu, "ds-cpu-1", "ds-gke-managed"}
    assert ours == set(gpu)
    for pod in pods:
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        assert conditions.get("PodScheduled") == "True"
    # The kubelet's part: the pods go Running and Ready, and the DaemonSet controller counts
    # them (status.numberReady).
    with NodeAgent(cp, set(gpu)) as agent:
        while True:
            status = cp.get(f"/apis/apps/v1/namespaces/{ns}/daemonsets/{name}").get("status", {})
            if status.get("numberReady") == len(gpu):
                break
            assert time.monotonic() < deadline, (status, agent.errors)
            time.sleep(0.5)
        leases = {lease["metadata"]["name"] for lease in cp.get(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")["items"]}
        assert set(gpu) <= leases
    assert status["desiredNumberScheduled"] == status["currentNumberScheduled"] == len(gpu)
