"""A version per node pool from one DaemonSet, against the stand-in API server: each node reads
its own labels with the pod's token and plans its pool's version; an upgrade waits while its
pool's maxUpgrading budget is taken by other nodes of that pool, never by another pool's."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from lib.fakes import FakeRunner
from lib.hosttrees import make_host

from cluster.nodes import LABELS, NODE, Env, make_room
from installer import planner
from installer.cluster import pools, protocol
from installer.config import Config
from installer.errors import PoolBudgetTimeout
from installer.hostroot import HostRoot

POOL = "cloud.google.com/gke-nodepool"
POLICY = f"""\
rules:
  - name: training
    nodeSelector:
      matchLabels: {{{POOL}: training}}
    version: "R595"
  - name: inference
    nodeSelector:
      matchLabels: {{{POOL}: inference}}
    version: "580.105.08"
    maxUpgrading: 2
"""
OTHER = "gpu-node-2"


@pytest.fixture
def policy(env: Env, tmp_path: Path) -> Path:
    path = tmp_path / "configmap" / "policy.yaml"
    path.parent.mkdir()
    path.write_text(POLICY)
    return path


def test_two_nodes_in_two_pools_plan_two_versions_from_one_setting(
        env: Env, policy: Path, tmp_path: Path) -> None:
    env.cluster.nodes[NODE]["metadata"]["labels"][POOL] = "training"
    env.cluster.add_node(OTHER, {POOL: "inference"})
    planned = {}
    for node in (NODE, OTHER):
        root = tmp_path / node
        make_host(root, distro="ubuntu-24.04", kernel="6.8.0-87-generic", gpus=[0x2330])
        # One DaemonSet: the same settings on both nodes but NODE_NAME.
        config = env.config(NODE_NAME=node, ROOT_MOUNT_DIR=str(root),
                            NVIDIA_INSTALL_DIR_CONTAINER=str(root / "no-container-mount"),
                            NVIDIA_DRIVER_VERSION="auto",
                            NVIDIA_INSTALLER_POOL_POLICY=str(policy))
        plan = planner.make_plan(config, FakeRunner(), fetch_bytes=lambda url: b"",
                                 fetch_runfile=None)  # type: ignore[arg-type]
        pool = next(d for d in plan.decisions if d.topic == "pool")
        planned[node] = (pool.value, plan.context.target.version)
    assert planned == {NODE: ("training", "595.91.07"), OTHER: ("inference", "580.105.08")}
    # Each read only its own Node, with the pod's token; nothing was written.
    reads = [r.path for r in env.cluster.requests]
    assert reads == [f"/api/v1/nodes/{NODE}", f"/api/v1/nodes/{OTHER}"]
    assert env.cluster.writes() == []


def pool_of(env: Env, policy: Path, config_env: dict[str, str] | None = None
            ) -> pools.Pool:
    config = env.config(NVIDIA_INSTALLER_POOL_POLICY=str(policy), **(config_env or {}))
    return pools.apply(config)[1]


def test_an_upgrade_waits_for_its_pools_budget_not_another_pools(
        env: Env, policy: Path) -> None:
    env.cluster.nodes[NODE]["metadata"]["labels"][POOL] = "training"
    # Another pool's node mid-upgrade takes nothing from this pool's budget of one.
    env.cluster.add_node("gpu-inference-1", {POOL: "inference",
                                             protocol.STATE_LABEL: "draining"})
    env.cluster.add_node(OTHER, {POOL: "training", protocol.STATE_LABEL: "waiting-for-holders"})
    rule = pool_of(env, policy).rule
    assert rule is not None and (rule.name, rule.max_upgrading) == ("training", 1)

    def lists() -> list[dict[str, list[str]]]:
        with env.cluster.lock:
            return [parse_qs(r.query) for r in env.cluster.requests if r.path == "/api/v1/nodes"]

    cordoned_while_waiting: list[bool] = []

    def other_finishes_once_this_node_waits() -> None:
        deadline = time.monotonic() + 20
        while not lists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with env.cluster.lock:
            cordoned_while_waiting.append("unschedulable" in env.cluster.nodes[NODE]["spec"])
            env.cluster.nodes[OTHER]["metadata"]["labels"][protocol.STATE_LABEL] = (
                "upgrade-done")

    waiter = threading.Thread(target=other_finishes_once_this_node_waits, daemon=True)
    waiter.start()
    config = env.config(NVIDIA_INSTALLER_POOL_WAIT_TIMEOUT="30")
    make_room_in_pool(env, config, policy)
    waiter.join()
    # Queued, not cordoned, while the other node of its pool upgraded.
    assert cordoned_while_waiting == [False]
    node = env.node()
    assert node["spec"]["unschedulable"] is True
    # Queued first (its own state label, through the admission policy), then draining.
    states = [r.body["metadata"]["labels"][protocol.STATE_LABEL] for r in env.cluster.writes()
              if protocol.STATE_LABEL in ((r.body or {}).get("metadata") or {}).get("labels", {})]
    assert states[0].startswith("queued-") and states[1] == "draining"
    # Listed again after the first answer said wait; by the upgrade-state label only.
    assert len(lists()) > 1
    assert all(q == {"labelSelector": [protocol.STATE_LABEL]} for q in lists())


def test_a_full_pool_times_out_with_the_node_untouched(env: Env, policy: Path) -> None:
    env.cluster.nodes[NODE]["metadata"]["labels"][POOL] = "training"
    env.cluster.add_node(OTHER, {POOL: "training", protocol.STATE_LABEL: "unloading"})
    before = env.node()
    config = env.config(NVIDIA_INSTALLER_POOL_WAIT_TIMEOUT="0.3")
    with pytest.raises(PoolBudgetTimeout) as timeout:
        make_room_in_pool(env, config, policy)
    assert timeout.value.message.startswith(
        "pool 'training': 1 node(s) upgrading or queued ahead (gpu-node-2 (unloading)) for "
        "0.3 s, its maxUpgrading is 1: node gpu-node-1 was not cordoned")
    assert (timeout.value.reference, timeout.value.exit_code) == ("pool-budget-timeout", 84)
    after = env.node()
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"] == {
        **LABELS, POOL: "training"}
    assert after["metadata"]["annotations"] == {}


def test_two_nodes_queued_at_once_agree_on_who_goes_first(env: Env, policy: Path) -> None:
    """A node queued earlier (or, at the same instant, with the smaller name) is ahead; a queue
    entry older than the wait itself is a run that died and is not."""
    env.cluster.nodes[NODE]["metadata"]["labels"][POOL] = "training"
    now = int(time.time() * 1000)
    env.cluster.add_node(OTHER, {POOL: "training", protocol.STATE_LABEL: f"queued-{now - 50}"})
    # Long enough that the entry is not stale by the time this node queues (a slow machine).
    config = env.config(NVIDIA_INSTALLER_POOL_WAIT_TIMEOUT="2")
    with pytest.raises(PoolBudgetTimeout, match=r"gpu-node-2 \(queued-"):
        make_room_in_pool(env, config, policy)
    assert protocol.STATE_LABEL not in env.node()["metadata"]["labels"]
    # The same entry, from a run that died an hour ago: not ahead.
    env.cluster.nodes[OTHER]["metadata"]["labels"][protocol.STATE_LABEL] = (
        f"queued-{now - 3_600_000}")
    make_room_in_pool(env, config, policy)
    assert env.node()["spec"]["unschedulable"] is True


def make_room_in_pool(env: Env, config: Config, policy: Path) -> None:
    protocol.make_room(config, HostRoot(config.root), env.layout(config), "580.105.08",
                       "595.91.07", pool=pool_of(env, policy))


def test_without_a_pool_the_protocol_lists_no_nodes(env: Env) -> None:
    make_room(env, env.config())
    assert not [r for r in env.cluster.requests if r.path == "/api/v1/nodes"]
