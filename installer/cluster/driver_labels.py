"""The verified driver on the Node object, where schedulers and operands look for it: the
labels operands select on (`nvidia.com/gpu.present=true`, GPU Feature Discovery's
`nvidia.com/cuda.driver-version.*` unless GFD runs) and GKE's annotation shape
(`cuda.driver-version.{full,major,minor,revision}`) under the installer's own prefix, and
under `cloud.google.com/` when asked. Written by server-side apply under a field manager of its
own: the API server then owns exactly these keys for the installer, and a key it no longer sends
(GFD turned on, GKE's annotations turned off) is removed by the next apply."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from installer.cluster.client import DRIVER_VERSION_MANAGER, Json, NodeClient, for_node
from installer.config import Config
from installer.errors import InstallerError

log = logging.getLogger(__name__)

PRESENT = "nvidia.com/gpu.present"
# GPU Feature Discovery's keys (NVIDIA/k8s-device-plugin internal/lm/nvml.go): the kernel
# driver's version, split at its dots.
GFD_PREFIX = "nvidia.com/cuda.driver-version."
# GKE's device plugin (--publish-driver-version) annotates nodes with these.
GKE_PREFIX = "cloud.google.com/cuda.driver-version."
# The installer's own: its label and annotation prefix elsewhere (the upgrade state, the gate's
# version label), in GKE's shape.
OWN_PREFIX = "nvidia-driver-installer/cuda.driver-version."
PARTS = ("full", "major", "minor", "revision")
# NVIDIA's driver versions: 580.105.08, or 470.57 (no revision) for a few old releases. What the
# readiness file says is checked before it becomes a label value.
_VERSION = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})(?:\.([0-9]{1,6}))?")

ClientFactory = Callable[[Config], NodeClient]



def version_parts(version: str) -> dict[str, str] | None:
    """full, major, minor, revision of a driver version (revision "" when it has none, as GFD
    writes it); None for anything else."""
    match = _VERSION.fullmatch(version)
    if match is None:
        return None
    return dict(zip(PARTS, (version, match.group(1), match.group(2), match.group(3) or "")))


def wanted(config: Config, version: str) -> tuple[dict[str, str], dict[str, str]] | None:
    """(labels, annotations) the node should carry for `version`; None when it is no driver
    version."""
    parts = version_parts(version)
    if parts is None:
        return None
    labels = {PRESENT: "true"}
    if not config.gpu_feature_discovery:
        labels.update({GFD_PREFIX + part: value for part, value in parts.items()})
    annotations = {OWN_PREFIX + part: value for part, value in parts.items()}
    if config.gke_driver_annotations:
        annotations.update({GKE_PREFIX + part: value for part, value in parts.items()})
    return labels, annotations


def applied_keys(node: Json) -> tuple[set[str], set[str]] | None:
    """The label and annotation keys the installer's last apply owns (its managedFields entry);
    None when the node shows no managedFields at all."""
    entries = node.get("metadata", {}).get("managedFields")
    if not isinstance(entries, list):
        return None
    labels: set[str] = set()
    annotations: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("manager") != DRIVER_VERSION_MANAGER or \
                entry.get("operation") != "Apply":
            continue
        meta = (entry.get("fieldsV1") or {}).get("f:metadata") or {}
        labels |= {k[2:] for k in meta.get("f:labels") or {} if k.startswith("f:")}
        annotations |= {k[2:] for k in meta.get("f:annotations") or {} if k.startswith("f:")}
    return labels, annotations


def in_place(node: Json, labels: dict[str, str], annotations: dict[str, str]) -> bool:
    """Whether the node already says exactly this: every key with its value, and no key left
    over from an earlier apply."""
    meta = node.get("metadata") or {}
    have_labels = meta.get("labels") or {}
    have_annotations = meta.get("annotations") or {}
    if any(have_labels.get(k) != v for k, v in labels.items()) or \
            any(have_annotations.get(k) != v for k, v in annotations.items()):
        return False
    owned = applied_keys(node)
    return owned is None or (owned[0] <= set(labels) and owned[1] <= set(annotations))


def publish(config: Config, version: str, node: Json | None = None,
            client: ClientFactory = for_node) -> bool:
    """Apply the driver's labels and annotations to this node (`node`: the Node as just read,
    to spare a read). Writes nothing when the node already says it. Returns whether it wrote.
    Raises ClusterApiForbidden (RBAC, policy), ClusterApiUnavailable, NodeNotFound."""
    keys = wanted(config, version)
    if keys is None:
        log.warning("not publishing driver version %r on the node: not a driver version",
                    version)
        return False
    labels, annotations = keys
    api = client(config)
    if node is None:
        node = api.get_node()
    if in_place(node, labels, annotations):
        return False
    api.apply_node({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": api.node, "labels": labels,
                                 "annotations": annotations}})
    log.info("node %s: driver %s published (%s)", api.node, version,
             ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return True


def report(config: Config, version: str, node: Json | None = None,
           client: ClientFactory = for_node) -> None:
    """publish for a run: a failure is a warning (the driver is what the run is for)."""
    try:
        publish(config, version, node, client)
    except InstallerError as error:
        log.warning("could not publish driver %s on node %s: %s", version, config.node_name,
                    error.message)
