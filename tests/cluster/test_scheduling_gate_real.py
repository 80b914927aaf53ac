"""The scheduling gate's taint and version label written by the installer's own code
(installer/cluster/gate.py) to a real kube-apiserver, through the shipped scheduling-gate RBAC
and policy with a token bound to a Pod on the Node: the taints the server and the pool put on
stay; an administrator's write between the gate's read and its write is a real 409 (the patch is
guarded by the resourceVersion it read), after which the gate reads again and keeps the
administrator's taint; a server that answers 429 or 500 (injected by the proxy) leaves the node
as it was and is the gate's own error."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lib.apiproxy import ApiProxy
from lib.controlplane import ControlPlane

from cluster.realcluster import RealNodes, apply_policies, real_nodes
from installer.cluster import gate
from installer.config import Config, build_config
from installer.errors import SchedulingGateUnavailable

REPO = Path(__file__).resolve().parents[2]
GATE = REPO / "daemonset" / "components" / "scheduling-gate"
POOL_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GATE_TAINT = {"key": "nvidia.com/gpu.driver-not-ready", "effect": "NoSchedule"}
_tests = iter(range(1_000_000))


@dataclass
class Gate:
    real: RealNodes
    proxy: ApiProxy
    node: str
    config: Config

    def get(self) -> dict[str, Any]:
        return self.real.get_node(self.node)

    def patches(self) -> list[tuple[int, bool]]:
        return [(s.status, s.injected) for s in self.proxy.writes()
                if s.path.split("?")[0] == f"/api/v1/nodes/{self.node}"]


@pytest.fixture
def env(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Gate]:
    with real_nodes(control_plane, tmp_path) as (real, proxy):
        apply_policies(control_plane, GATE / "admission-policy.yaml")
        real.bind(GATE / "rbac.yaml")
        real.wait_allowed("patch", "nodes")
        node = f"gate-{next(_tests)}"
        real.node(node, labels={"nvidia.com/gpu.deploy.device-plugin": "true"})
        control_plane.request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"taints": [
            *real.get_node(node)["spec"].get("taints", []), POOL_TAINT]}},
            content_type="application/merge-patch+json")
        kubeconfig = proxy.kubeconfig(tmp_path / "kubeconfig", real.token(node))
        root = tmp_path / "host"
        root.mkdir()
        config = build_config({"NVIDIA_INSTALLER_SCHEDULING_GATE": "true", "NODE_NAME": node,
                               "NVIDIA_INSTALLER_KUBECONFIG": str(kubeconfig),
                               "ROOT_MOUNT_DIR": str(root),
                               "NVIDIA_INSTALL_DIR_CONTAINER": str(root / "no-mount")}, {})
        yield Gate(real, proxy, node, config)


def test_close_then_open_keeps_every_other_taint(env: Gate) -> None:
    before = env.get()["spec"]["taints"]
    assert POOL_TAINT in before  # and the server's own node.kubernetes.io/not-ready
    assert gate.close(env.config, "driver not installed yet")
    assert env.get()["spec"]["taints"] == [*before, GATE_TAINT]
    assert not gate.close(env.config, "again")  # closed: nothing written
    assert gate.open_for(env.config, "580.105.08")
    node = env.get()
    assert node["spec"]["taints"] == before
    assert node["metadata"]["labels"]["nvidia-driver-installer/driver-version"] == "580.105.08"
    assert env.patches() == [(200, False), (200, False)]


def test_an_admins_write_between_read_and_write_is_a_real_conflict_and_kept(env: Gate) -> None:
    admin = {"key": "example.com/maintenance", "effect": "NoSchedule"}

    def admin_taints() -> None:
        node = env.get()
        env.real.cp.request("PATCH", f"/api/v1/nodes/{env.node}", {"spec": {"taints": [
            *node["spec"]["taints"], admin]}}, content_type="application/merge-patch+json")

    env.proxy.before("PATCH", f"/api/v1/nodes/{env.node}$", admin_taints)
    assert gate.close(env.config, "driver not installed yet")
    taints = env.get()["spec"]["taints"]
    assert admin in taints and GATE_TAINT in taints and POOL_TAINT in taints
    assert env.patches() == [(409, False), (200, False)]  # the server's own 409


@pytest.mark.parametrize("status", [429, 500])
def test_a_failing_server_leaves_the_node_and_is_the_gates_error(env: Gate,
                                                                 status: int) -> None:
    before = env.get()
    env.proxy.fail("PATCH", f"/api/v1/nodes/{env.node}$", status, times=10,
                   retry_after="1" if status == 429 else None)
    with pytest.raises(SchedulingGateUnavailable, match="scheduling gate"):
        gate.close(env.config, "driver not installed yet")
    assert env.get() == before
    assert env.patches() and all(p == (status, True) for p in env.patches())
