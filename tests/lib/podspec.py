"""A pod spec's container to an OCI runtime bundle's config.json, with the kubelet's semantics.

What follows Kubernetes and containerd's CRI plugin (their public docs and the OCI runtime
spec): the command is `command`+`args`, else the image's Entrypoint with `args` or its Cmd; the
image's Env first, the container's `env` over it; hostPath volumes are recursive private bind
mounts (`readOnly` adds ro); the termination message file is a per-container host file bind
mounted at `terminationMessagePath`; `privileged` gives every capability, a writable /sys and
cgroupfs, no masked paths and access to every device; otherwise the runtime's default capability
set less `drop` plus `add`, masked and read-only /proc paths; `allowPrivilegeEscalation: false`
is no_new_privs; `runAsUser`/`runAsGroup`; `readOnlyRootFilesystem`; `hostPID`/`hostNetwork`
share the host's namespaces, otherwise the pod's containers join one network namespace.
Left out, because nothing here has them: an API server (no service account token, no
`valueFrom`), cluster DNS (no resolv.conf), seccomp (the kubelet's default is Unconfined), and
SELinux labels, which the runtime passes only when SELinux is enabled on the node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_TERMINATION_PATH = "/dev/termination-log"
# containerd's default capability set for unprivileged containers.
DEFAULT_CAPS = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
)  # fmt: skip
ALL_CAPS = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
    "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
    "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
)  # fmt: skip
MASKED_PATHS = (
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
)  # fmt: skip
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


class PodSpecError(ValueError):
    """The pod spec asks for something this tool (and a node without an API server) cannot do."""


@dataclass(frozen=True)
class Image:
    """An unpacked image: its root filesystem and its OCI config (Entrypoint, Cmd, Env, ...)."""

    rootfs: Path
    config: dict[str, Any] = field(default_factory=dict)


def command_of(container: dict[str, Any], image: Image) -> list[str]:
    entrypoint = list(image.config.get("Entrypoint") or [])
    if "command" in container:
        return [*container["command"], *container.get("args", [])]
    if "args" in container:
        return [*entrypoint, *container["args"]]
    return [*entrypoint, *(image.config.get("Cmd") or [])]


def env_of(container: dict[str, Any], image: Image) -> list[str]:
    merged: dict[str, str] = {}
    for item in image.config.get("Env") or []:
        name, _, value = item.partition("=")
        merged[name] = value
    for item in container.get("env", []):
        if "value" not in item and "valueFrom" in item:
            # The kubelet fills the downward API's spec.nodeName itself; anything else
            # (secrets, config maps) needs an API server.
            field = item["valueFrom"].get("fieldRef", {}).get("fieldPath")
            if field != "spec.nodeName":
                raise PodSpecError(f"env {item['name']}: valueFrom needs an API server")
            merged[item["name"]] = os.uname().nodename
            continue
        merged[item["name"]] = str(item.get("value", ""))
    return [f"{k}={v}" for k, v in merged.items()]


def _security(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    merged = {k: v for k, v in (pod.get("securityContext") or {}).items()
              if k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seLinuxOptions")}
    merged.update(container.get("securityContext") or {})
    return merged


def _user(security: dict[str, Any], image: Image) -> dict[str, int]:
    image_user = str(image.config.get("User") or "0")
    uid_text, _, gid_text = image_user.partition(":")
    if not uid_text.isdigit() or (gid_text and not gid_text.isdigit()):
        raise PodSpecError(f"image user {image_user!r}: only numeric users are supported")
    uid = int(security.get("runAsUser", int(uid_text)))
    gid = int(security.get("runAsGroup", int(gid_text) if gid_text else 0))
    if security.get("runAsNonRoot") and uid == 0:
        raise PodSpecError("runAsNonRoot with uid 0: the kubelet refuses to start it")
    return {"uid": uid, "gid": gid}


def _capabilities(security: dict[str, Any]) -> list[str]:
    if security.get("privileged"):
        return list(ALL_CAPS)
    caps = security.get("capabilities") or {}
    dropped = {f"CAP_{c.upper()}" for c in caps.get("drop", [])}
    added = [f"CAP_{c.upper()}" for c in caps.get("add", [])]
    base = [] if "CAP_ALL" in dropped else [c for c in DEFAULT_CAPS if c not in dropped]
    return base + [c for c in added if c not in base]


def process_of(pod: dict[str, Any], container: dict[str, Any], image: Image,
               args: list[str] | None = None) -> dict[str, Any]:
    """The OCI process for the container (or, with `args`, for an exec into it: a probe)."""
    security = _security(pod, container)
    caps = _capabilities(security)
    privileged = bool(security.get("privileged"))
    return {
        "terminal": False,
        "user": _user(security, image),
        "args": args if args is not None else command_of(container, image),
        "env": env_of(container, image),
        "cwd": container.get("workingDir") or image.config.get("WorkingDir") or "/",
        "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
        "noNewPrivileges": not privileged and security.get("allowPrivilegeEscalation") is False,
    }


def _volume_sources(pod: dict[str, Any]) -> dict[str, str]:
    sources = {}
    for volume in pod.get("volumes", []):
        if "hostPath" not in volume:
            raise PodSpecError(f"volume {volume['name']}: only hostPath volumes are supported")
        sources[volume["name"]] = volume["hostPath"]["path"]
    return sources


def mounts_of(pod: dict[str, Any], container: dict[str, Any], termination_file: Path,
              privileged: bool) -> list[dict[str, Any]]:
    sources = _volume_sources(pod)
    user = []
    for mount in container.get("volumeMounts", []):
        options = ["rbind", "rprivate"] + (["ro"] if mount.get("readOnly") else ["rw"])
        user.append({"destination": mount["mountPath"], "type": "bind",
                     "source": sources[mount["name"]], "options": options})
    termination = container.get("terminationMessagePath", DEFAULT_TERMINATION_PATH)
    user.append({"destination": termination, "type": "bind", "source": str(termination_file),
                 "options": ["rbind", "rprivate", "rw"]})
    sys_mode = "rw" if privileged else "ro"
    defaults = [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", sys_mode]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", sys_mode]},
    ]
    # A user mount replaces the runtime's default at the same place; parents mount first.
    taken = {m["destination"] for m in user}
    mounts = [m for m in defaults if m["destination"] not in taken] + user
    return sorted(mounts, key=lambda m: len(Path(m["destination"]).parts))


def _memory_bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def _cpu_shares(quantity: str) -> int:
    milli = float(quantity[:-1]) if quantity.endswith("m") else float(quantity) * 1000
    return max(2, int(milli * 1024 / 1000))


def config_of(pod: dict[str, Any], container: dict[str, Any], image: Image,
              termination_file: Path, netns: str | None, cgroup: str) -> dict[str, Any]:
    """config.json of the container's bundle (rootfs: the image's, by absolute path)."""
    security = _security(pod, container)
    privileged = bool(security.get("privileged"))
    namespaces: list[dict[str, str]] = [{"type": "mount"}, {"type": "ipc"}, {"type": "cgroup"}]
    if not pod.get("hostPID"):
        namespaces.append({"type": "pid"})
    if not pod.get("hostNetwork"):
        namespaces += [{"type": "uts"}, {"type": "network", "path": netns or ""}]
    namespaces = [{k: v for k, v in n.items() if v} for n in namespaces]
    resources: dict[str, Any] = {
        "devices": [{"allow": privileged, "access": "rwm"}],
    }
    requests = (container.get("resources") or {}).get("requests") or {}
    limits = (container.get("resources") or {}).get("limits") or {}
    if "cpu" in requests:
        resources["cpu"] = {"shares": _cpu_shares(str(requests["cpu"]))}
    if "memory" in limits:
        resources["memory"] = {"limit": _memory_bytes(str(limits["memory"]))}
    linux: dict[str, Any] = {
        "namespaces": namespaces,
        "resources": resources,
        "cgroupsPath": cgroup,
    }
    if not privileged:
        linux["maskedPaths"] = list(MASKED_PATHS)
        linux["readonlyPaths"] = list(READONLY_PATHS)
    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": process_of(pod, container, image),
        "root": {"path": str(image.rootfs),
                 "readonly": bool(security.get("readOnlyRootFilesystem"))},
        "mounts": mounts_of(pod, container, termination_file, privileged),
        "linux": linux,
    }
    if not pod.get("hostNetwork"):
        config["hostname"] = "pod"
    return config
