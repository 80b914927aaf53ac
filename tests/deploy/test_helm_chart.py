"""The Helm chart in daemonset/ renders, with Helm's own engine (Helm's Go SDK through the
helm-python-sdk wheel, offline), exactly what `kubectl kustomize` renders for each overlay and
example it has values for: the same objects, field for field."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import yaml
from lib.manifests import (
    DAEMONSET_DIR,
    container_env,
    installer_container,
    installer_daemonset,
    render,
)

from installer.config import from_env

# (kustomization, the chart's values that mean the same)
CASES = [
    ("overlays/ubuntu", {}),
    ("overlays/debian", {"image": {"tag": "0.1.0-debian12"}}),
    ("overlays/rocky", {"image": {"tag": "0.1.0-rocky9"}}),
    ("overlays/scheduling-gate", {"schedulingGate": {"enabled": True}}),
    ("overlays/upgrade-protocol", {"upgradeProtocol": {"enabled": True}}),
    ("overlays/module-registry", {"moduleRegistry": {"enabled": True}}),
    ("overlays/metrics", {"metrics": {"enabled": True}}),
    ("examples/metrics-access-check", {"metrics": {"enabled": True, "accessCheck": True}}),
    ("examples/node-readiness-controller", {"clusterSignals": {"enabled": True}}),
    ("examples/driver-on-node", {"clusterSignals": {"enabled": True,
                                                    "gkeDriverAnnotations": True}}),
    ("examples/gate-and-upgrade-protocol", {"schedulingGate": {"enabled": True},
                                            "upgradeProtocol": {"enabled": True}}),
    ("examples/force-eviction", {"upgradeProtocol": {"enabled": True,
                                                     "forceEviction": True}}),
    ("examples/imex-host-managed", {"imex": {"enabled": True}}),
    ("examples/node-pools", {"upgradeProtocol": {"enabled": True},
                             "nodePools": {"enabled": True, "policy": yaml.safe_load(
                                 (DAEMONSET_DIR / "examples/node-pools/configmap.yaml")
                                 .read_text())["data"]["policy.yaml"]}}),
]


def helm() -> Any:
    """helm_python (pip install helm-python-sdk, Python >= 3.10): skipped locally without it,
    failed under CI."""
    try:
        import helm_python
    except ImportError:
        message = ("helm-python-sdk is not installed (pip install -e '.[test]' on Python "
                   ">= 3.10)")
        if os.environ.get("CI") and sys.version_info >= (3, 10):
            pytest.fail(message)
        pytest.skip(message)
    return helm_python


def chart_render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm().Chart.load(str(DAEMONSET_DIR))
    rendered = chart.render(values, name="nvidia-driver-installer", namespace="kube-system")
    return [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]


def by_identity(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    found = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
             for d in docs}
    assert len(found) == len(docs), "an object appears twice"
    return found


@pytest.mark.parametrize(("kustomization", "values"), CASES, ids=[c[0] for c in CASES])
def test_the_chart_renders_what_kustomize_renders(kustomization: str,
                                                  values: dict[str, Any]) -> None:
    chart = by_identity(chart_render(values))
    kustomize = by_identity(render(DAEMONSET_DIR / kustomization))
    assert sorted(chart) == sorted(kustomize)
    for identity, doc in kustomize.items():
        assert chart[identity] == doc, identity


def test_the_comparison_can_fail() -> None:
    # Another tag, or a component left out, is a difference the test above sees.
    ubuntu = by_identity(render(DAEMONSET_DIR / "overlays" / "ubuntu"))
    rocky = by_identity(chart_render({"image": {"tag": "0.1.0-rocky9"}}))
    assert sorted(rocky) == sorted(ubuntu)
    assert rocky != ubuntu
    gate = by_identity(chart_render({"schedulingGate": {"enabled": True}}))
    assert sorted(gate) != sorted(ubuntu)


def test_gpu_feature_discovery_reaches_the_installer() -> None:
    for gfd in (False, True):
        docs = chart_render({"clusterSignals": {"enabled": True, "gpuFeatureDiscovery": gfd}})
        config = from_env(container_env(installer_container(installer_daemonset(docs))))
        assert config.cluster_signals and config.gpu_feature_discovery is gfd
        assert not config.gke_driver_annotations


def test_every_overlay_and_component_has_a_case() -> None:
    covered = {c[0] for c in CASES}
    overlays = {f"overlays/{p.name}" for p in (DAEMONSET_DIR / "overlays").iterdir()}
    assert overlays <= covered
    components = {p.name for p in (DAEMONSET_DIR / "components").iterdir()}
    values = yaml.safe_load((DAEMONSET_DIR / "values.yaml").read_text())
    assert {"scheduling-gate", "upgrade-protocol", "force-eviction", "metrics",
            "metrics-auth", "cluster-signals", "imex", "node-pools"} == components
    assert {"schedulingGate", "upgradeProtocol", "metrics", "moduleRegistry",
            "clusterSignals", "imex", "nodePools"} <= set(values)


def test_helm_lint_finds_no_error() -> None:
    everything = {"schedulingGate": {"enabled": True},
                  "metrics": {"enabled": True, "accessCheck": True},
                  "clusterSignals": {"enabled": True, "gkeDriverAnnotations": True,
                                     "gpuFeatureDiscovery": True},
                  "upgradeProtocol": {"enabled": True, "forceEviction": True},
                  "moduleRegistry": {"enabled": True}, "imex": {"enabled": True},
                  "nodePools": {"enabled": True, "policy": "rules: []\n"}}
    for values in ({}, everything):
        report = helm().lint(str(DAEMONSET_DIR), values, strict=True)
        assert report["errors"] == []
        # Helm's one remark: a chart icon is recommended (severity 1, INFO).
        assert all(m["severity"] <= 1 for m in report["messages"]), report
