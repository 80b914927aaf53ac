"""The node-side upgrade protocol: cordon, pause GPU clients, drain the node (GPU pods and
/dev/nvidia* holders: installer.cluster.drain); afterwards restore exactly what it changed. What
to restore lives in a node annotation, so a killed run is finished by the next one."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import safefs
from installer.cluster import dra, drain
from installer.cluster.client import FIELD_MANAGER, Conflict, Json, NodeClient, for_node
from installer.config import Config
from installer.errors import (
    ClusterApiUnavailable,
    InstallerError,
    UpgradeAnnotationInvalid,
)
from installer.hostroot import HostRoot
from installer.layout import Layout

if TYPE_CHECKING:
    from installer.cluster.pools import Pool

log = logging.getLogger(__name__)

# What the next run must restore (JSON); removed in the same patch that restores.
ANNOTATION = "nvidia-driver-installer/upgrade"
# The phase, for `kubectl get nodes -L nvidia-driver-installer/upgrade-state`.
STATE_LABEL = "nvidia-driver-installer/upgrade-state"
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-driver-upgrade"
HINT_NAME = ".upgrade-protocol"
POLL_SECONDS = 2.0
CONFLICT_RETRIES = 8

ClientFactory = Callable[[Config], NodeClient]



def hint_path(layout: Layout) -> Path:
    """A local marker that the node may carry our changes: the run that finds it must reach the
    API server to restore them (without it, a warm run tolerates an unreachable API)."""
    return layout.install_local / HINT_NAME


def preflight(config: Config, client: ClientFactory = for_node) -> None:
    """Read the node: the API server answers with our credentials. Run before anything is
    staged on the host, so an unreachable API fails a held upgrade with the host unchanged.
    Raises ClusterApi* errors and NodeNotFound."""
    client(config).get_node()


def make_room(config: Config, root: HostRoot, layout: Layout, old: str, new: str,
              client: ClientFactory = for_node, *, pool: Pool | None = None) -> None:
    """Free the loaded driver for an upgrade: wait for the node's pool budget (a pool policy's
    maxUpgrading), cordon (remembering whether it was cordoned), pause GPU clients by label,
    evict GPU pods, wait for /dev/nvidia* to be closed.

    On a failure here (eviction or holders timeout, API errors) the node is restored and the
    old driver keeps working. Raises EvictionTimeout, DriverHoldersTimeout, ClusterApi* errors.
    """
    api = client(config)
    node = api.get_node()
    if pool is not None and pool.rule is not None and _saved(node) is None:
        # A node that carries an unfinished upgrade already counts against its pool.
        from installer.cluster import pools

        pools.wait_for_turn(api, pool.policy, pool.rule, STATE_LABEL, config.pool_wait_timeout,
                            POLL_SECONDS)
        node = api.get_node()
    safefs.write_atomic(hint_path(layout), f"{old} -> {new}\n")
    saved = _begin(api, config, node, old, new)
    uid = str(node["metadata"].get("uid", ""))
    paused = ", ".join(sorted(saved["labels"])) or "none"
    cordon = ("cordoned it" if saved["cordoned"] else "it stays cordoned (it was cordoned "
              "before; it will not be uncordoned)")
    log.info("upgrade %s -> %s: node %s %s; paused GPU clients: %s", old, new, api.node,
             cordon, paused)
    api.event(uid, "DriverUpgradeStarted",
              f"driver {old} -> {new}: {cordon}; labels set to {PAUSED}: {paused}")
    try:
        drain.evict_gpu_pods(api, uid, config)
        _pause_after_pods(api, uid, saved)
        _set_state(api, "waiting-for-holders")
        drain.wait_for_holders(api, uid, root, config)
        _set_state(api, "unloading")
        api.event(uid, "DriverUnloading", f"no process holds /dev/nvidia*: unloading {old}")
    except InstallerError as error:
        try:
            _restore(api, "upgrade-failed")
        except InstallerError as restore_error:
            log.error("could not restore node %s: %s (the next run retries)", api.node,
                      restore_error.message)
            raise error from None
        api.event(uid, "DriverUpgradeFailed", f"{error.message}; node restored, driver {old} "
                  "kept", warning=True)
        hint_path(layout).unlink(missing_ok=True)
        raise


def finish(config: Config, layout: Layout, client: ClientFactory = for_node) -> None:
    """After a successful run: restore what an upgrade (this run's or a killed one's) changed
    on the node. Reads the node; writes only when the annotation says there is something to
    restore. Raises ClusterApi* errors only when the local hint says the node needs it."""
    hint = hint_path(layout)
    try:
        api = client(config)
        node = api.get_node()
    except ClusterApiUnavailable as error:
        if hint.exists():
            raise
        log.warning("upgrade protocol: %s (nothing to restore on this node as far as the host "
                    "knows)", error.message)
        return
    if _saved(node) is not None:
        saved = _restore(api, "upgrade-done")
        if saved is not None:
            what = "uncordoned" if saved["cordoned"] else "left cordoned (it was cordoned before)"
            log.info("upgrade %s -> %s done: node %s %s, labels restored", saved["from"],
                     saved["to"], api.node, what)
            api.event(str(node["metadata"].get("uid", "")), "DriverUpgradeDone",
                      f"driver {saved['to']} verified; node {what}; labels restored")
    hint.unlink(missing_ok=True)


def finish_switched_off(config: Config, layout: Layout,
                        client: ClientFactory = for_node) -> None:
    """After a successful run with the protocol off, on a node whose marker says an earlier
    run (protocol on) may have left it cordoned and paused: restore it all the same (switching
    the protocol off must not strand a cordoned node). Raises ClusterApi* errors, and
    ClusterApiUnavailable without NODE_NAME."""
    if not config.node_name:
        raise ClusterApiUnavailable(
            f"{hint_path(layout)} says an upgrade by an earlier run (upgrade protocol on) may "
            "have left this node cordoned with its GPU clients paused, and NODE_NAME is unset: "
            "cannot restore it",
            hint="Set NODE_NAME (and the API credentials) once so the installer restores the "
            "node, or restore it by hand (uncordon, the nvidia.com/gpu.deploy.* labels, the "
            f"{ANNOTATION} annotation) and delete the marker file.")
    log.info("the upgrade protocol is off, but an earlier run left an upgrade unfinished on "
             "node %s: restoring it", config.node_name)
    finish(config, layout, client)


def failed(config: Config, layout: Layout, error: InstallerError,
           client: ClientFactory = for_node) -> None:
    """After a failed run with our changes on the node: keep it cordoned and paused (the driver
    may be unloaded), mark it failed and say why. Best effort: the error being raised wins."""
    if not hint_path(layout).exists():
        return
    try:
        api = client(config)
        node = api.get_node()
        if _saved(node) is None:
            return
        _set_state(api, "upgrade-failed")
        api.event(str(node["metadata"].get("uid", "")), "DriverUpgradeFailed",
                  f"{error.reference}: {error.message}; the node stays cordoned with its GPU "
                  "clients paused until a run succeeds", warning=True)
    except InstallerError as other:
        log.warning("could not mark node %s upgrade-failed: %s", config.node_name,
                    other.message)


def _saved(node: Json) -> dict[str, Any] | None:
    """What the annotation says to restore, or None when there is none. Raises
    UpgradeAnnotationInvalid when it is not what _begin writes (a forged annotation must not
    choose what is restored)."""
    text = (node["metadata"].get("annotations") or {}).get(ANNOTATION)
    if text is None:
        return None
    try:
        saved = json.loads(text)
    except ValueError:
        saved = None
    labels = saved.get("labels") if isinstance(saved, dict) else None
    if not (isinstance(saved, dict) and isinstance(saved.get("from"), str)
            and isinstance(saved.get("to"), str) and isinstance(saved.get("cordoned"), bool)
            and isinstance(labels, dict)
            and all(isinstance(k, str) and k.startswith(DEPLOY_PREFIX)
                    and (v is None or isinstance(v, str)) for k, v in labels.items())):
        name = node["metadata"].get("name", "?")
        raise UpgradeAnnotationInvalid(
            f"node {name}: the annotation {ANNOTATION} is {str(text)[:200]!r}, not what the "
            "installer writes ({\"from\", \"to\", \"cordoned\", \"labels\"}): the node's state "
            "before the upgrade is unknown, so nothing was changed")
    return dict(saved)


def _begin(api: NodeClient, config: Config, node: Json, old: str, new: str) -> dict[str, Any]:
    """Record what to restore and cordon + pause, in one patch guarded by resourceVersion. An
    annotation left by a killed run is kept: it knows the node as it was before."""
    for _ in range(CONFLICT_RETRIES):
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        saved = _saved(node)
        if saved is None:
            keys = [DEPLOY_PREFIX + c for c in config.pause_components]
            saved = {
                "from": old,
                "to": new,
                "cordoned": not (node.get("spec") or {}).get("unschedulable", False),
                # Only labels that are on (or absent: our device-plugin extra selects on it
                # being absent); an admin's "false" stays.
                "labels": {k: labels.get(k) for k in keys if labels.get(k) in (None, "true")},
            }
        else:
            log.info("node %s carries an unfinished upgrade (%s -> %s): continuing it",
                     api.node, saved["from"], saved["to"])
        want = {k: PAUSED for k in saved["labels"] if not _after_pods(k)}
        want[STATE_LABEL] = "draining"
        patch: Json = {"metadata": {"resourceVersion": meta["resourceVersion"],
                                    "annotations": {ANNOTATION: json.dumps(saved,
                                                                           sort_keys=True)},
                                    "labels": want},
                       "spec": {"unschedulable": True}}
        try:
            api.patch_node(patch)
            return saved
        except Conflict:
            node = api.get_node()
    raise ClusterApiUnavailable(f"node {api.node} kept changing while cordoning it "
                                f"({CONFLICT_RETRIES} conflicts)")


def _restore(api: NodeClient, final_state: str) -> dict[str, Any] | None:
    """Put back the labels we paused (if still paused), uncordon only if we cordoned, drop the
    annotation: one patch guarded by resourceVersion. Returns what was restored."""
    for _ in range(CONFLICT_RETRIES):
        node = api.get_node()
        saved = _saved(node)
        if saved is None:
            return None
        labels = node["metadata"].get("labels") or {}
        restore = {k: v for k, v in saved["labels"].items() if labels.get(k) == PAUSED}
        patch: Json = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"],
                                    "annotations": {ANNOTATION: None},
                                    "labels": {**restore, STATE_LABEL: final_state}}}
        other = _cordoned_by_someone_else(node)
        if saved["cordoned"] and other is None:
            patch["spec"] = {"unschedulable": None}
        elif saved["cordoned"]:
            saved = {**saved, "cordoned": False}
            log.info("node %s stays cordoned: %s set spec.unschedulable during the upgrade",
                     api.node, other)
        try:
            api.patch_node(patch)
            return saved
        except Conflict:
            continue
    raise ClusterApiUnavailable(f"node {api.node} kept changing while restoring it "
                                f"({CONFLICT_RETRIES} conflicts)")


def _cordoned_by_someone_else(node: Json) -> str | None:
    """The field manager other than the installer that last set spec.unschedulable (an
    admin's `kubectl cordon` after an uncordon, a maintenance controller), from the node's
    managedFields; None when the cordon is still the installer's (or the server keeps no
    managedFields). A `kubectl cordon` of a node that is already cordoned sends nothing and
    cannot be seen (docs/deploy.md)."""
    if not (node.get("spec") or {}).get("unschedulable"):
        return None
    for entry in node["metadata"].get("managedFields") or []:
        fields = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:unschedulable" in fields and entry.get("manager") != FIELD_MANAGER:
            return str(entry.get("manager") or "another client")
    return None


def _after_pods(label: str) -> bool:
    return label[len(DEPLOY_PREFIX):] in dra.AFTER_PODS


def _pause_after_pods(api: NodeClient, uid: str, saved: dict[str, Any]) -> None:
    """Pause what must outlive the GPU pods (NVIDIA's DRA kubelet plugin), now that they are
    gone; its label was recorded with the others, so it is restored with them."""
    late = {k: PAUSED for k in saved["labels"] if _after_pods(k)}
    if late:
        api.patch_node({"metadata": {"labels": late}})
        log.info("no GPU pod is left on node %s: paused %s", api.node, ", ".join(sorted(late)))
        api.event(uid, "DraPluginPaused", "no pod holds a GPU claim any more: labels set to "
                  f"{PAUSED}: {', '.join(sorted(late))}")


def _set_state(api: NodeClient, state: str) -> None:
    api.patch_node({"metadata": {"labels": {STATE_LABEL: state}}})
    log.info("upgrade state of node %s: %s", api.node, state)
