"""The metrics component (daemonset/components/metrics): `installer metrics` as a native
sidecar before the installer, with the installer's image and settings and read-only mounts of
what it reads; a PodMonitor that selects these pods on the container's port; the
PrometheusRule's alerts (their behaviour: tests/integration/test_metrics_prometheus.py)."""

from __future__ import annotations

import functools
from typing import Any

import yaml
from lib.manifests import (
    DAEMONSET_DIR,
    SAMPLE_HOST_IP,
    container_env,
    installer_container,
    installer_daemonset,
    pod_spec,
    render,
)

from installer.config import from_env
from installer.layout import READY_FILE
from installer.metrics.exporter import parse_listen

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
    # The node's own address (the downward API's status.hostIP, which Prometheus scrapes),
    # not every address of a host-network pod; bracketed, so an IPv6 node's parses too.
    assert metrics["args"] == ["metrics", "--listen", "[$(HOST_IP)]:9402"]
    assert {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}} in \
        metrics["env"]
    for address in (SAMPLE_HOST_IP, "fd00:10:128::7"):
        listen = metrics["args"][2].replace("$(HOST_IP)", address)
        assert parse_listen(listen) == (address, 9402)
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


def access_check_docs() -> list[dict[str, Any]]:
    return list(render(DAEMONSET_DIR / "examples" / "metrics-access-check"))


def test_the_access_check_gets_the_review_rbac_a_token_and_a_reader() -> None:
    docs = access_check_docs()
    ds = installer_daemonset(docs)
    spec = pod_spec(ds)
    metrics = spec["initContainers"][0]
    assert metrics["name"] == "metrics"
    assert metrics["args"][-2:] == ["--access", "tokenreview"]
    # The reviews are asked as the installer's account: its token is mounted.
    assert spec["serviceAccountName"] == "nvidia-driver-installer"
    assert spec["automountServiceAccountToken"] is True
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    bindings = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    review = roles["nvidia-driver-installer-metrics-auth"]["rules"]
    assert sorted((r["apiGroups"], r["resources"], r["verbs"]) for r in review) == [
        (["authentication.k8s.io"], ["tokenreviews"], ["create"]),
        (["authorization.k8s.io"], ["subjectaccessreviews"], ["create"])]
    assert {"kind": "ServiceAccount", "name": "nvidia-driver-installer",
            "namespace": ds["metadata"]["namespace"]} in next(
        b for b in bindings if b["roleRef"]["name"] == "nvidia-driver-installer-metrics-auth"
    )["subjects"]
    reader = roles["nvidia-driver-installer-metrics-reader"]["rules"]
    assert reader == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # The PodMonitor sends the reader's token, from a Secret in its own namespace.
    monitor = of_kind(docs, "PodMonitor")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    secret_name = endpoint["authorization"]["credentials"]["name"]
    secret = next(d for d in docs if d["kind"] == "Secret")
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == (
        secret_name, monitor["metadata"]["namespace"])
    assert secret["type"] == "kubernetes.io/service-account-token"
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert {"kind": "ServiceAccount", "name": account, "namespace": "kube-system"} in next(
        b for b in bindings if b["roleRef"]["name"] == "nvidia-driver-installer-metrics-reader"
    )["subjects"]


def test_without_the_access_check_the_pod_has_no_api_identity() -> None:
    docs = rendered()
    spec = pod_spec(installer_daemonset(docs))
    assert spec.get("automountServiceAccountToken") is False
    assert "--access" not in spec["initContainers"][0]["args"]
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "Secret")]
