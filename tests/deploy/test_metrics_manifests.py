"""The metrics component (daemonset/components/metrics): `installer metrics` as a native
sidecar before the installer, with the installer's image and settings and read-only mounts of
what it reads; a PodMonitor that selects these pods on the container's port; the
PrometheusRule's alerts (their behaviour: tests/integration/test_metrics_prometheus.py)."""

from __future__ import annotations

import functools
from typing import Any

import yaml

from deploy.manifests import (
    DAEMONSET_DIR,
    container_env,
    installer_container,
    installer_daemonset,
    pod_spec,
    render,
)
from installer.config import from_env
from installer.layout import READY_FILE

OVERLAY = DAEMONSET_DIR / "overlays" / "metrics"


@functools.lru_cache(maxsize=1)
def _rendered() -> str:
    return yaml.safe_dump_all(render(OVERLAY))


def rendered() -> list[dict[str, Any]]:
    """The overlay rendered once for the file (a fresh copy each call)."""
    return list(yaml.safe_load_all(_rendered()))


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def test_the_exporter_is_a_sidecar_started_before_the_installer() -> None:
    ds = installer_daemonset(rendered())
    init = pod_spec(ds)["initContainers"]
    assert [c["name"] for c in init][:2] == ["metrics", "nvidia-driver-installer"]
    metrics = init[0]
    # restartPolicy Always: it runs beside the installer's retries, and for the pod's life.
    assert metrics["restartPolicy"] == "Always"
    assert metrics["args"] == ["metrics", "--listen", ":9402"]
    assert metrics["ports"] == [{"name": "metrics", "containerPort": 9402, "protocol": "TCP"}]
    installer = installer_container(ds)
    assert metrics["image"] == installer["image"]
    env = container_env(metrics)
    for name in ("NVIDIA_INSTALL_DIR_HOST", "NVIDIA_INSTALL_DIR_CONTAINER", "ROOT_MOUNT_DIR"):
        assert env[name] == container_env(installer)[name]
    from_env(env)  # settings the installer accepts


def test_the_exporter_reads_the_installers_files_and_writes_none() -> None:
    ds = installer_daemonset(rendered())
    metrics = pod_spec(ds)["initContainers"][0]
    env = container_env(metrics)
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod_spec(ds)["volumes"]
               if "hostPath" in v}
    mounts = {m["mountPath"]: (volumes.get(m["name"]), m.get("readOnly"))
              for m in metrics["volumeMounts"]}
    assert mounts[env["NVIDIA_INSTALL_DIR_CONTAINER"]] == (env["NVIDIA_INSTALL_DIR_HOST"], True)
    assert mounts[str(READY_FILE.parent)] == (str(READY_FILE.parent), True)
    assert mounts[env["ROOT_MOUNT_DIR"]] == ("/", True)
    assert mounts["/dev"] == ("/dev", None)  # NVML opens the device nodes


def test_the_pod_monitor_selects_these_pods_on_the_metrics_port() -> None:
    docs = rendered()
    ds = installer_daemonset(docs)
    monitor = of_kind(docs, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == ds["metadata"]["namespace"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    wanted = monitor["spec"]["selector"]["matchLabels"]
    assert wanted and all(labels.get(k) == v for k, v in wanted.items())
    ports = {p["name"] for c in pod_spec(ds)["initContainers"] for p in c.get("ports", [])}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in \
        endpoint["relabelings"]


def test_the_rule_ships_the_five_alerts() -> None:
    rule = of_kind(rendered(), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert sorted(alerts) == ["NvidiaDriverInstallFailing", "NvidiaDriverNotReady",
                              "NvidiaDriverRecordInvalid", "NvidiaFabricManagerFlapping",
                              "NvidiaFabricNotComplete"]
    assert alerts["NvidiaDriverNotReady"]["for"] == "30m"
    assert all(r["expr"].count("nvidia_driver_installer_") >= 1 for r in alerts.values())
