"""The manifests users apply: valid Kubernetes objects, kustomize overlays that render, the rendered
file in sync, and the settings docs/deploy.md promises."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from lib.manifests import (
    CRD_GROUPS,
    DAEMONSET_DIR,
    GPUS_READY_FILE,
    K8S_VERSIONS,
    POLICY_KINDS,
    POLICY_MIN_VERSION,
    READY_DIR,
    READY_FILE,
    REPO,
    SIDECAR_MIN_VERSION,
    container_env,
    installer_container,
    installer_daemonset,
    kustomization_dirs,
    load_all,
    manifest_files,
    pod_spec,
    render,
)

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="pip install kubernetes-validate"
)


def _validate(doc: dict[str, Any], version: str) -> None:
    # strict: unknown fields (a typo such as `tolerations` under a container) are errors too.
    if doc.get("kind") in POLICY_KINDS and _older(version, POLICY_MIN_VERSION):
        version = POLICY_MIN_VERSION  # the upgrade protocol's policy needs Kubernetes >= 1.30
    if str(doc.get("apiVersion", "")).startswith(CRD_GROUPS):
        return
    if _has_sidecar(doc) and _older(version, SIDECAR_MIN_VERSION):
        version = SIDECAR_MIN_VERSION
    kubernetes_validate.validate(doc, version, strict=True)


def _has_sidecar(doc: dict[str, Any]) -> bool:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return any(c.get("restartPolicy") == "Always" for c in spec.get("initContainers", []))


def _older(a: str, b: str) -> bool:
    return tuple(map(int, a.split("."))) < tuple(map(int, b.split(".")))


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=_ids(manifest_files()))
def test_manifest_is_valid_kubernetes(path: Path, version: str) -> None:
    docs = load_all(path)
    assert docs
    for doc in docs:
        _validate(doc, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("directory", kustomization_dirs(), ids=_ids(kustomization_dirs()))
def test_kustomization_renders_valid_kubernetes(directory: Path, version: str) -> None:
    docs = render(directory)
    installer_daemonset(docs)
    for doc in docs:
        _validate(doc, version)


def test_strict_validation_catches_a_misplaced_field() -> None:
    ds = installer_daemonset(load_all(DAEMONSET_DIR / "base" / "daemonset.yaml"))
    installer_container(ds)["tolerations"] = [{"operator": "Exists"}]
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(ds, K8S_VERSIONS[-1])


def test_rendered_file_matches_the_ubuntu_overlay() -> None:
    rendered = render(DAEMONSET_DIR / "overlays" / "ubuntu")
    shipped = load_all(DAEMONSET_DIR / "nvidia-driver-installer.yaml")
    assert shipped == rendered, "run daemonset/render.sh to regenerate nvidia-driver-installer.yaml"


def _pyproject_version() -> str:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    assert match
    return match.group(1)


@pytest.mark.parametrize(
    ("overlay", "suffix"),
    [("ubuntu", "ubuntu24.04"), ("rocky", "rocky9"), ("debian", "debian12")],
)
def test_overlay_uses_the_image_build_sh_tags(overlay: str, suffix: str) -> None:
    ds = installer_daemonset(render(DAEMONSET_DIR / "overlays" / overlay))
    spec = pod_spec(ds)
    images = {c["image"] for c in spec["initContainers"] + spec["containers"]}
    # Both containers run the installer image (the second one for its readiness probe).
    tag = f"{_pyproject_version()}-{suffix}"
    assert images == {f"registry.example.com/nvidia-driver-installer:{tag}"}


NODE_EXPRESSIONS = [
    {"key": "cloud.google.com/gke-accelerator", "operator": "Exists"},
    # GKE manages the driver where this label is set; its own installers require it absent.
    {"key": "cloud.google.com/gke-gpu-driver-version", "operator": "DoesNotExist"},
    {"key": "cloud.google.com/gke-os-distribution", "operator": "NotIn", "values": ["cos"]},
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
]


def test_base_follows_the_daemonset_conventions() -> None:
    ds = installer_daemonset(load_all(DAEMONSET_DIR / "base" / "daemonset.yaml"))
    # Same identity as GKE's and JD Cloud's: `kubectl apply` updates theirs in place (the selector
    # is immutable, so a different one would be refused).
    assert ds["metadata"]["name"] == "nvidia-driver-installer"
    assert ds["metadata"]["namespace"] == "kube-system"
    assert ds["spec"]["selector"] == {"matchLabels": {"k8s-app": "nvidia-driver-installer"}}
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "10%"},
    }
    spec = pod_spec(ds)
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    # Holders of /dev/nvidia* are read from /root/proc: nothing needs the host's PID namespace.
    assert "hostPID" not in spec
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": NODE_EXPRESSIONS}]
    init = installer_container(ds)
    assert "command" not in init and "args" not in init, "the image's `installer run` must run"
    assert init["terminationMessagePath"] == "/dev/termination-log"
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert init["resources"] == {"requests": {"cpu": "150m", "memory": "256Mi"}}
    for container in spec["containers"]:
        assert "cpu" not in container.get("resources", {}).get("limits", {})


def test_readiness_probe_reads_the_file_the_installer_writes() -> None:
    ds = installer_daemonset(load_all(DAEMONSET_DIR / "base" / "daemonset.yaml"))
    spec = pod_spec(ds)
    (waiter,) = [c for c in spec["containers"] if c["name"] == "driver-ready"]
    probe = " ".join(waiter["readinessProbe"]["exec"]["command"])
    assert f"test -f {READY_FILE}" in probe
    # The probe's shell and `test` come from the image (pause has neither).
    assert waiter["image"] == installer_container(ds)["image"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in waiter["volumeMounts"]}
    assert mounts == {READY_DIR: READY_DIR}, "the probe must see the host's readiness dir"
    assert READY_FILE.startswith(READY_DIR + "/")
    # Not the GPU Operator's file: its validator owns /run/nvidia/validations and deletes it.
    assert not READY_FILE.startswith("/run/nvidia/")


@pytest.mark.parametrize(
    ("example", "label"),
    [("node-label-jdcloud", "jdcloud.com/jke-accelerator"), ("node-label-custom", "gpu/nividia")],
)
def test_node_label_examples_replace_the_label(example: str, label: str) -> None:
    ds = installer_daemonset(render(DAEMONSET_DIR / "examples" / example))
    affinity = pod_spec(ds)["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    expressions = term["matchExpressions"]
    assert expressions[0] == {"key": label, "operator": "Exists"}
    # The image's architecture stays required whatever the GPU label is.
    assert {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]} in expressions


def test_device_plugin_lands_only_where_the_installer_does() -> None:
    (plugin,) = load_all(DAEMONSET_DIR / "extras" / "device-plugin.yaml")
    terms = pod_spec(plugin)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for expression in NODE_EXPRESSIONS:
        assert expression in terms[0]["matchExpressions"]


@pytest.mark.parametrize("path", ["base/daemonset.yaml", "extras/device-plugin.yaml"])
def test_unprivileged_readers_of_installer_files_carry_selinux_options(path: str) -> None:
    for doc in load_all(DAEMONSET_DIR / path):
        spec = pod_spec(doc)
        for container in spec.get("initContainers", []) + spec["containers"]:
            context = container.get("securityContext", {})
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            if context.get("privileged") or READY_DIR not in mounts:
                continue
            assert context["seLinuxOptions"] == {"type": "spc_t", "level": "s0"}, container


def test_device_plugin_waits_for_the_driver_and_uses_the_install_dir() -> None:
    (plugin,) = load_all(DAEMONSET_DIR / "extras" / "device-plugin.yaml")
    ours = installer_daemonset(load_all(DAEMONSET_DIR / "base" / "daemonset.yaml"))
    install_dir_host = container_env(installer_container(ours))[
        "NVIDIA_INSTALL_DIR_HOST"
    ]
    spec = pod_spec(plugin)
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    (wait,) = spec["initContainers"]
    # gpus-ready, not driver-ready: on a fabric board (HGX, NVL72) the driver is verified
    # before Fabric Manager and NVLSM register the GPUs, and a plugin started then advertises
    # GPUs whose CUDA answers 802.
    script = " ".join(wait["command"])
    assert f"until [ -f {GPUS_READY_FILE} ]" in script
    assert READY_FILE not in script
    assert {volumes[m["name"]] for m in wait["volumeMounts"]} == {READY_DIR}
    (ctr,) = spec["containers"]
    mounts = {m["mountPath"]: volumes[m["name"]] for m in ctr["volumeMounts"]}
    assert mounts["/usr/local/nvidia"] == install_dir_host
    env = container_env(ctr)
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    # Ours, plus leaving a node paused for a driver upgrade (tests/deploy/test_upgrade_rbac.py).
    (plugin_term,) = spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (our_term,) = pod_spec(ours)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert plugin_term["matchExpressions"][: len(our_term["matchExpressions"])] == \
        our_term["matchExpressions"]


def test_every_documented_wait_for_the_gpus_waits_for_gpus_ready() -> None:
    """A consumer waits for one file, the same on every board: each wait in the manifests and
    docs names gpus-ready (driver-ready alone is there during a fabric bring-up)."""
    waits = []
    for path in [*sorted(DAEMONSET_DIR.rglob("*.yaml")), *sorted((REPO / "docs").glob("*.md")),
                 REPO / "README.md"]:
        for line in path.read_text().splitlines():
            if "until [ -f " in line or "until test -f " in line:
                waits.append((path.name, line.strip()))
    assert waits, "no wait found: the device plugin's and readiness.md's are expected"
    assert {name for name, _ in waits} >= {"device-plugin.yaml", "readiness.md"}
    for name, line in waits:
        assert GPUS_READY_FILE in line, (name, line)


def test_smoke_test_pod_requests_one_gpu() -> None:
    (pod,) = load_all(DAEMONSET_DIR / "extras" / "cuda-vector-add.yaml")
    (ctr,) = pod["spec"]["containers"]
    assert ctr["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert pod["spec"]["restartPolicy"] == "Never"


def test_pinned_driver_version_is_an_lts_release_in_the_shipped_catalog() -> None:
    ds = installer_daemonset(load_all(DAEMONSET_DIR / "base" / "daemonset.yaml"))
    version = container_env(installer_container(ds))[
        "NVIDIA_DRIVER_VERSION"
    ]
    shipped = REPO / "installer" / "release" / "data" / "releases.json"
    catalog = json.loads(shipped.read_text("utf-8"))
    branch = catalog[version.split(".")[0]]
    assert branch["type"] == "lts branch"
    assert version in [d["release_version"] for d in branch["driver_info"]]


def test_manifests_parse_as_plain_yaml_without_tabs() -> None:
    for path in DAEMONSET_DIR.rglob("*.yaml"):
        if path.parent == DAEMONSET_DIR / "templates":
            continue  # the Helm chart's templates (tests/deploy/test_helm_chart.py)
        text = path.read_text(encoding="utf-8")
        assert "\t" not in text, path
        list(yaml.safe_load_all(text))
