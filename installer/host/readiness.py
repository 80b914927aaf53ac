"""Whether this node can take GPU work now: the driver verified on this boot and still loaded,
and every component that applies up. The scheduling gate opens on `pending(...) == []` and on
nothing else."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from installer.host.loaded import loaded_driver
from installer.hostroot import HostRoot
from installer.layout import READY_FILE


def component_file(name: str) -> PurePosixPath:
    return READY_FILE.parent / f"{name}-ready"


def _values(text: str | None) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (text or "").splitlines() if "=" in line)


def verified_version(root: HostRoot) -> str | None:
    """The version the readiness file names, when that driver is the one loaded now."""
    version = _values(root.read_text(READY_FILE)).get("DRIVER_VERSION")
    loaded = loaded_driver(root)
    if not version or loaded is None or loaded.version != version:
        return None
    return version


def pending(root: HostRoot, components: Sequence[str]) -> list[str]:
    """What keeps this node from GPU work now, a phrase each; empty when nothing does.
    `components`: the names whose long-running containers must report ready beside the
    driver's file (`components.names()`)."""
    waiting = driver_pending(root)
    version = verified_version(root)
    return waiting if waiting or version is None else components_pending(root, version,
                                                                          components)


def driver_pending(root: HostRoot) -> list[str]:
    """The driver's part of `pending`: verified on this boot and still loaded. (A run starts
    before the components' containers do, so it closes the gate on this part only.)"""
    text = root.read_text(READY_FILE)
    if text is None:
        return [f"the driver is not verified on this boot ({READY_FILE} is absent)"]
    version = _values(text).get("DRIVER_VERSION")
    loaded = loaded_driver(root)
    if not version:
        return [f"{READY_FILE} names no DRIVER_VERSION"]
    if loaded is None or loaded.version != version:
        now = loaded.version if loaded is not None and loaded.version else "none"
        return [f"the verified driver {version} is not the one loaded (loaded: {now})"]
    return []


def components_pending(root: HostRoot, version: str, components: Sequence[str]) -> list[str]:
    """Each of `components` whose container has not reported ready for `version`: its
    /run/nvidia-driver-installer/<name>-ready names another driver or is absent. A container
    with nothing to do on this node writes its file too, with STATE=not-applicable (Fabric
    Manager counts only on NVSwitch nodes, and with NVIDIA_FABRICMANAGER=false not at all)."""
    waiting = []
    for name in components:
        reported = _values(root.read_text(component_file(name))).get("DRIVER_VERSION")
        if reported != version:
            waiting.append(f"{name} is not up for driver {version} ({component_file(name)} "
                           + ("is absent)" if reported is None else f"names {reported})"))
    return waiting
