"""The upgrade protocol's drain under a PodDisruptionBudget on a real control plane: the
budget's status is kube-controller-manager's disruption controller's (currentHealthy,
disruptionsAllowed, observedGeneration), the pods are run and finished by the node agent, the
installer deletes through its pod-bound token and the shipped policy. With one disruption
allowed, one pod goes; the next waits (EvictionBlocked) until a replacement is healthy
elsewhere, and only then goes; a budget that never allows it ends in EvictionTimeout naming the
pod, with the node's pods as they were."""

from __future__ import annotations

import threading
import time

import pytest

from cluster.realdrain import Drain, drain, ready
from installer.errors import EvictionTimeout

__all__ = ["drain"]  # the fixture, imported for pytest

TRAIN = {"app": "train"}


def budget(d: Drain, min_available: int, healthy: int) -> None:
    d.cp.create(f"/apis/policy/v1/namespaces/{d.ns}/poddisruptionbudgets", {
        "metadata": {"name": "train"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": TRAIN}}})
    deadline = time.monotonic() + 30
    while True:  # the disruption controller has seen the Running, Ready pods
        status = d.cp.get(f"/apis/policy/v1/namespaces/{d.ns}/poddisruptionbudgets/train").get(
            "status", {})
        if status.get("currentHealthy") == healthy:
            return
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def test_the_budget_lets_one_pod_go_and_the_next_after_a_replacement(drain: Drain) -> None:
    for name, node in (("train-a", drain.node), ("train-b", drain.node),
                       ("train-c", drain.other)):
        drain.gpu_pod(name, node=node, labels=TRAIN)
    config = ready(drain)
    budget(drain, 2, healthy=3)  # one disruption allowed
    errors: list[BaseException] = []

    def run() -> None:
        try:
            drain.make_room(config)
        except BaseException as e:  # handed to the test's thread
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while "EvictionBlocked" not in [e["reason"] for e in drain.real.events(drain.node)]:
        assert time.monotonic() < deadline and not errors, errors
        time.sleep(0.1)
    # One of the two goes (the node agent finishes its deletion); the other waits for the
    # budget, however long.
    while len(drain.pods() & {"train-a", "train-b"}) != 1:
        assert time.monotonic() < deadline and not errors, errors
        time.sleep(0.1)
    time.sleep(1.0)
    left = drain.pods()
    assert len(left & {"train-a", "train-b"}) == 1 and "train-c" in left and not errors
    drain.gpu_pod("train-d", node=drain.other, labels=TRAIN)  # the workload's replacement
    thread.join(60)
    assert not thread.is_alive() and errors == []
    assert drain.pods() == {"train-c", "train-d"}
    deletes = [s for s in drain.proxy.writes() if s.method == "DELETE"]
    assert len(deletes) == 2 and all(s.status == 200 for s in deletes)


def test_a_budget_that_never_allows_it_ends_in_a_timeout_naming_the_pod(drain: Drain) -> None:
    drain.gpu_pod("train-a", labels=TRAIN)
    drain.gpu_pod("idle", gpus=0)  # no GPU: never a client of the drain
    ready(drain)
    budget(drain, 1, healthy=1)  # none allowed
    config = drain.config(NVIDIA_INSTALLER_EVICTION_TIMEOUT="2")
    with pytest.raises(EvictionTimeout, match=rf"{drain.ns}/train-a \(.*"):
        drain.make_room(config)
    assert drain.pods() == {"train-a", "idle"}
    assert not [s for s in drain.proxy.writes() if s.method == "DELETE"]
