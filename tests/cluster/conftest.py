"""The `env` fixture (stand-in API server, host root, kubeconfig) for every test here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.admission import load_policies
from cluster.apiserver import ApiServer, Cluster, cluster_role_rules
from cluster.nodes import LABELS, NODE, POLICY, RBAC, Env
from installer.cluster import protocol


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    monkeypatch.setattr(protocol, "POLL_SECONDS", 0.05)
    monkeypatch.setattr("installer.cluster.drain.POLL_SECONDS", 0.05)
    cluster = Cluster(rules=cluster_role_rules(RBAC), policies=load_policies(POLICY),
                      token_node=NODE)
    cluster.add_node(NODE, LABELS)
    root = tmp_path / "host"
    (root / "proc").mkdir(parents=True)
    with ApiServer(cluster) as server:
        yield Env(cluster, server, root, server.kubeconfig(tmp_path))
