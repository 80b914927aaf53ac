"""A version per node pool against a real kube-apiserver (tests/lib/controlplane.py, through
tests/lib/apiproxy.py): the pool policy of daemonset/examples/node-pools as shipped, Nodes with
GKE's pool label, components/upgrade-protocol's RBAC and admission policy as shipped, each node's
installer with a token from the TokenRequest API bound to a Pod on that node. Each node's plan
reads its own Node and takes its rule's version; the upgrade protocol counts its pool's budget
(maxUpgrading) from the server's node list selected by the upgrade-state label, never counting
another pool's nodes, and queues (its own label, through the shipped policy) without cordoning
while the budget is taken."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from lib.controlplane import ControlPlane, token_claims
from lib.fakes import FakeRunner
from lib.hosttrees import make_host
from lib.realcluster import OnRealNodes, component_nodes

from installer import planner
from installer.cluster import pools, protocol
from installer.config import Config, build_config
from installer.errors import PoolBudgetTimeout
from installer.hostroot import HostRoot
from installer.layout import Layout

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = REPO / "daemonset" / "components" / "upgrade-protocol"
EXAMPLE = REPO / "daemonset" / "examples" / "node-pools" / "configmap.yaml"
POOL = "cloud.google.com/gke-nodepool"
STATE = protocol.STATE_LABEL
_tests = iter(range(1_000_000))


def example_policy() -> str:
    (configmap,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    return str(configmap["data"]["policy.yaml"])


@dataclass
class Pools(OnRealNodes):
    tmp: Path
    policy: Path
    prefix: str

    def node(self, suffix: str, pool: str, state: str | None = None) -> str:
        """A Node of `pool` (the administrator sets its upgrade state, as another node's
        installer would have)."""
        name = f"{self.prefix}-{suffix}"
        self.real.node(name, labels={POOL: pool, **({STATE: state} if state else {})})
        return name

    def set_state(self, node: str, state: str | None) -> None:
        self.cp.request("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {
            STATE: state}}}, content_type="application/merge-patch+json")

    def config(self, node: str, **env: str) -> Config:
        """The DaemonSet's settings, the same on every node but NODE_NAME and the pod's
        token (a kubeconfig per node, its token bound to a Pod there)."""
        root = self.tmp / node
        if not root.exists():
            make_host(root, distro="ubuntu-24.04", kernel="6.8.0-87-generic", gpus=[0x2330])
        token = self.real.token(node)
        assert token_claims(token)["kubernetes.io"]["node"]["name"] == node
        kubeconfig = self.proxy.kubeconfig(self.tmp / f"{node}.kubeconfig", token)
        return build_config({
            "NVIDIA_INSTALLER_UPGRADE_PROTOCOL": "true", "NODE_NAME": node,
            "NVIDIA_INSTALLER_KUBECONFIG": str(kubeconfig), "ROOT_MOUNT_DIR": str(root),
            "NVIDIA_INSTALL_DIR_CONTAINER": str(root / "no-container-mount"),
            "NVIDIA_DRIVER_VERSION": "auto", "NVIDIA_INSTALLER_POOL_POLICY": str(self.policy),
            "NVIDIA_INSTALLER_EVICTION_TIMEOUT": "30", "NVIDIA_INSTALLER_HOLDERS_TIMEOUT": "30",
            **env}, {})

    def make_room(self, config: Config) -> None:
        pool = pools.apply(config)[1]
        layout = Layout.from_config(config, HostRoot(config.root))
        layout.install_local.mkdir(parents=True, exist_ok=True)
        protocol.make_room(config, HostRoot(config.root), layout, "580.105.08", "595.91.07",
                           pool=pool)

    def requests(self) -> list[tuple[str, str, dict[str, list[str]]]]:
        with self.proxy.lock:
            seen = list(self.proxy.seen)
        return [(s.method, urlsplit(s.path).path, parse_qs(urlsplit(s.path).query))
                for s in seen]

    def lists(self) -> list[dict[str, list[str]]]:
        return [q for m, p, q in self.requests() if (m, p) == ("GET", "/api/v1/nodes")]

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.real.get_node(node)["metadata"].get("labels") or {})


@pytest.fixture
def env(control_plane: ControlPlane, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Pools]:
    monkeypatch.setattr(protocol, "POLL_SECONDS", 0.1)
    monkeypatch.setattr("installer.cluster.drain.POLL_SECONDS", 0.1)
    policy = tmp_path / "configmap" / "policy.yaml"
    policy.parent.mkdir()
    policy.write_text(example_policy())
    with component_nodes(control_plane, tmp_path, PROTOCOL) as (real, proxy):
        real.wait_allowed("list", "nodes")
        yield Pools(real, proxy, tmp_path, policy, f"pool-{next(_tests)}")


def test_the_example_policy_is_what_these_tests_assume() -> None:
    policy = pools.parse(example_policy(), str(EXAMPLE))
    assert [(r.name, r.match, r.default, r.version, r.max_upgrading) for r in policy.rules] == [
        ("training", ((POOL, "training"),), False, "R595", 2),
        ("inference", (), True, "R580", 1)]


def test_each_node_reads_its_own_node_and_plans_its_pools_version(env: Pools) -> None:
    training = env.node("train-1", "training")
    other = env.node("infer-1", "inference")
    planned = {}
    for node in (training, other):
        before = len(env.requests())
        plan = planner.make_plan(env.config(node), FakeRunner(), fetch_bytes=lambda url: b"",
                                 fetch_runfile=None)  # type: ignore[arg-type]
        decision = next(d for d in plan.decisions if d.topic == "pool")
        planned[node] = (decision.value, plan.context.target.version)
        # The plan read this node's own Node with its own pod's token, and wrote nothing.
        assert [(m, p) for m, p, _ in env.requests()[before:]] == [
            ("GET", f"/api/v1/nodes/{node}")]
    # R595 and R580 resolved from the release catalog the installer carries
    # (installer/release/data); no rule matches gke-nodepool=inference: the default's branch.
    assert planned == {training: ("training", "595.91.07"), other: ("inference", "580.126.20")}
    assert env.proxy.writes() == []


def test_the_budget_counts_its_pools_nodes_from_the_servers_list(env: Pools) -> None:
    """Training's maxUpgrading is 2: one training node mid-upgrade and two of another pool
    leave room, so the node goes at once after one list."""
    node = env.node("train-1", "training")
    env.node("train-2", "training", "draining")
    env.node("infer-1", "inference", "draining")
    env.node("infer-2", "inference", "unloading")
    env.make_room(env.config(node))
    assert env.real.get_node(node)["spec"]["unschedulable"] is True
    assert env.lists() == [{"labelSelector": [STATE]}]


def test_a_full_pool_queues_without_cordoning_until_a_node_finishes(env: Pools) -> None:
    node = env.node("train-1", "training")
    env.node("train-2", "training", "draining")
    env.node("train-3", "training", "waiting-for-holders")
    # Another pool's upgrade: never counted against training's budget.
    env.node("infer-1", "inference", "unloading")
    config = env.config(node, NVIDIA_INSTALLER_POOL_WAIT_TIMEOUT="60")
    seen_waiting: list[tuple[str | None, bool]] = []

    def third_finishes_once_this_node_waits() -> None:
        deadline = time.monotonic() + 30
        while len(env.lists()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        stored = env.real.get_node(node)
        seen_waiting.append((stored["metadata"]["labels"].get(STATE),
                             bool(stored["spec"].get("unschedulable"))))
        env.set_state(f"{env.prefix}-train-3", "upgrade-done")

    finisher = threading.Thread(target=third_finishes_once_this_node_waits, daemon=True)
    finisher.start()
    env.make_room(config)
    finisher.join(30)
    # While it waited: queued by its own label (through the shipped policy), not cordoned.
    ((state, cordoned),) = seen_waiting
    assert state is not None and state.startswith(pools.QUEUED) and not cordoned
    assert env.real.get_node(node)["spec"]["unschedulable"] is True
    assert env.labels(node)[STATE] != state  # the protocol's own state since
    assert len(env.lists()) > 2
    assert all(q == {"labelSelector": [STATE]} for q in env.lists())


def test_a_full_pool_times_out_with_the_node_as_it_was(env: Pools) -> None:
    node = env.node("train-1", "training")
    env.node("train-2", "training", "draining")
    env.node("train-3", "training", "unloading")
    before = env.real.get_node(node)
    with pytest.raises(PoolBudgetTimeout) as timeout:
        env.make_room(env.config(node, NVIDIA_INSTALLER_POOL_WAIT_TIMEOUT="1"))
    assert timeout.value.message.startswith(
        f"pool 'training': 2 node(s) upgrading or queued ahead ({env.prefix}-train-2 "
        f"(draining), {env.prefix}-train-3 (unloading)) for 1 s, its maxUpgrading is 2: "
        f"node {node} was not cordoned")
    after = env.real.get_node(node)
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    assert (after["metadata"].get("annotations") or {}) == (
        before["metadata"].get("annotations") or {})


def test_the_default_pools_budget_is_one_and_counts_no_training_node(env: Pools) -> None:
    """inference (the default rule, maxUpgrading 1): one other inference node mid-upgrade fills
    it; the training nodes mid-upgrade are not in it."""
    node = env.node("infer-1", "inference")
    env.node("infer-2", "inference", "draining")
    env.node("train-1", "training", "draining")
    env.node("train-2", "training", "unloading")
    with pytest.raises(PoolBudgetTimeout) as timeout:
        env.make_room(env.config(node, NVIDIA_INSTALLER_POOL_WAIT_TIMEOUT="0.5"))
    message = timeout.value.message
    assert message.startswith("pool 'inference': ") and "its maxUpgrading is 1" in message
    assert f"{env.prefix}-infer-2 (draining)" in message
    assert f"{env.prefix}-train-" not in message
    assert "unschedulable" not in env.real.get_node(node)["spec"]
    assert STATE not in env.labels(node)


def test_two_nodes_queued_at_once_agree_on_who_goes_first(env: Pools) -> None:
    """training's budget is 2, one taken by a node draining: a node queued earlier is ahead and
    this one times out with its queue label taken off again; the same entry left by a run that
    died an hour ago is not ahead, and this node goes. (Training, not the default rule: Nodes
    other tests on this server leave behind are in the default pool.)"""
    node = env.node("train-1", "training")
    env.node("train-2", "training", "draining")
    other = env.node("train-3", "training")
    config = env.config(node, NVIDIA_INSTALLER_POOL_WAIT_TIMEOUT="3")
    # Queued just before this node queues: not stale by then, even on a slow machine.
    now = int(time.time() * 1000)
    env.set_state(other, f"{pools.QUEUED}{now - 50}")
    with pytest.raises(PoolBudgetTimeout, match=rf"{other} \(queued-{now - 50}\)"):
        env.make_room(config)
    assert STATE not in env.labels(node)
    assert "unschedulable" not in env.real.get_node(node)["spec"]
    env.set_state(other, f"{pools.QUEUED}{now - 3_600_000}")
    env.make_room(config)
    assert env.real.get_node(node)["spec"]["unschedulable"] is True


def test_without_a_pool_policy_the_protocol_lists_no_nodes(env: Pools) -> None:
    node = env.node("train-1", "training")
    env.node("train-2", "training", "draining")  # would fill a budget, were there one
    config = dataclasses.replace(env.config(node), pool_policy=None)
    layout = Layout.from_config(config, HostRoot(config.root))
    layout.install_local.mkdir(parents=True, exist_ok=True)
    protocol.make_room(config, HostRoot(config.root), layout, "580.105.08", "595.91.07")
    assert env.real.get_node(node)["spec"]["unschedulable"] is True
    assert env.lists() == []
