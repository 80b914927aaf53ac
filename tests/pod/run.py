"""Runs a pod spec on this machine with runc, in pod order: init containers one by one, each to
a clean exit; then the containers, detached; then their readiness probes, exec'd into them.

Each container gets its own writable layer (an overlay on the image's root filesystem, as a
snapshotter gives it), its own termination message file (read the way the kubelet reads it),
and the pod's containers share one network namespace unless the pod uses the host's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lib.podspec import Image, config_of, process_of

# The kubelet's FallbackToLogsOnError: the log's tail, at most 80 lines and 2048 bytes.
FALLBACK_LINES = 80
FALLBACK_BYTES = 2048


class HostPathError(RuntimeError):
    """A hostPath volume's type does not match the host: the kubelet would not start the pod."""


@dataclass
class Pod:
    """One pod's state directory (under a tmpfs: overlay upper layers cannot sit on overlayfs)."""

    spec: dict[str, Any]
    images: dict[str, Image]
    state: Path
    runtime: str = "runc"
    # The simulated GPUs: the PCI tree the vm harness bind-mounts over the host's
    # /sys/bus/pci/devices. A container's fresh sysfs would not show it, where real hardware
    # shows in every sysfs; the fake nvidia.ko scans it through the loading process's VFS.
    pci_tree: Path | None = None
    # The simulated ConnectX-7 ports' classes (/sys/class/infiniband, infiniband_mad), bound
    # over the container's /sys/class for the same reason: on a real NVLink5 node mlx5_ib's and
    # ib_umad's class entries show in every sysfs, so the DaemonSet mounts nothing for them.
    sys_class: Path | None = None

    @property
    def name(self) -> str:
        return re.sub(r"[^a-z0-9-]", "-", str(self.spec.get("_name", "pod")))

    def runc(self, *args: str) -> list[str]:
        return [self.runtime, "--root", str(self.state / "runtime"), *args]

    def netns(self) -> str | None:
        if self.spec.get("hostNetwork"):
            return None
        path = Path("/var/run/netns") / self.name
        if not path.exists():
            subprocess.run(["ip", "netns", "add", self.name], check=True)
            subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
        return str(path)

    def host_paths(self) -> None:
        """The kubelet's hostPath types: make what `...OrCreate` asks for, check the rest."""
        for volume in self.spec.get("volumes", []):
            path = Path(volume["hostPath"]["path"])
            kind = volume["hostPath"].get("type", "")
            if kind == "DirectoryOrCreate":
                path.mkdir(mode=0o755, parents=True, exist_ok=True)
            elif kind == "FileOrCreate":
                path.touch(mode=0o644)
            elif kind == "Directory" and not path.is_dir():
                raise HostPathError(f"volume {volume['name']}: {path} is not a directory")
            elif kind == "File" and not path.is_file():
                raise HostPathError(f"volume {volume['name']}: {path} is not a file")

    def bundle(self, container: dict[str, Any]) -> Path:
        """The container's bundle: config.json and an overlay root over the image's."""
        image = self.images[container["image"]]
        directory = self.state / container["name"]
        for part in ("upper", "work", "rootfs"):
            (directory / part).mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={image.rootfs},upperdir={directory / 'upper'},"
             f"workdir={directory / 'work'}", str(directory / "rootfs")],
            check=True,
        )
        termination = directory / "termination-log"
        termination.touch()
        config = config_of(self.spec, container, Image(directory / "rootfs", image.config),
                           termination, self.netns(),
                           f"/kubepods/{self.name}/{container['name']}")
        if self.pci_tree is not None:
            config["mounts"].append({"destination": "/sys/bus/pci/devices", "type": "bind",
                                     "source": str(self.pci_tree), "options": ["rbind", "ro"]})
        if self.sys_class is not None:
            config["mounts"].append({"destination": "/sys/class", "type": "bind",
                                     "source": str(self.sys_class), "options": ["rbind", "ro"]})
        (directory / "config.json").write_text(json.dumps(config, indent=2))
        return directory

    def termination_message(self, container: dict[str, Any], exit_code: int) -> str:
        directory = self.state / container["name"]
        message = (directory / "termination-log").read_text(errors="replace")
        policy = container.get("terminationMessagePolicy", "File")
        if not message and exit_code != 0 and policy == "FallbackToLogsOnError":
            lines = (directory / "log").read_text(errors="replace").splitlines()
            message = "\n".join(lines[-FALLBACK_LINES:])[-FALLBACK_BYTES:]
        return message

    def run(self, timeout: float) -> dict[str, Any]:
        report: dict[str, Any] = {"init": [], "started": [], "probes": {}}
        self.host_paths()
        for container in self.spec.get("initContainers", []):
            directory = self.bundle(container)
            returncode = self._run_attached(container["name"], directory, timeout)
            subprocess.run(self.runc("delete", "--force", container["name"]),
                           capture_output=True, check=False)
            report["init"].append({
                "name": container["name"],
                "exit_code": returncode,
                "termination_message": self.termination_message(container, returncode),
                "log": (directory / "log").read_text(errors="replace")[-20000:],
            })
            if returncode != 0:
                return report  # the kubelet starts nothing else until it succeeds
        for container in self.spec.get("containers", []):
            directory = self.bundle(container)
            with open(directory / "log", "wb") as log:
                subprocess.run(
                    self.runc("run", "--detach", "--bundle", str(directory), container["name"]),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    timeout=60, check=True,
                )
            report["started"].append(container["name"])
        report["probes"] = self.probe()
        return report

    def _run_attached(self, name: str, directory: Path, timeout: float) -> int:
        """`runc run` in the foreground; its output goes to the container's log and, line by
        line, to stderr (a console shows where a slow install is). Killed after `timeout`."""
        deadline = time.monotonic() + timeout
        with open(directory / "log", "wb") as log:
            process = subprocess.Popen(
                self.runc("run", "--bundle", str(directory), name),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                sys.stderr.write(f"{name}| {line.decode(errors='replace')}")
                if time.monotonic() > deadline:
                    break
            if time.monotonic() > deadline:
                subprocess.run(self.runc("kill", name, "KILL"), capture_output=True, check=False)
            return process.wait()

    def probe(self) -> dict[str, Any]:
        """Each container's readiness probe (exec), run inside it with its own process settings."""
        results = {}
        for container in self.spec.get("containers", []):
            command = ((container.get("readinessProbe") or {}).get("exec") or {}).get("command")
            if not command or not (self.state / container["name"] / "config.json").is_file():
                continue  # no probe, or the container never started
            image = self.images[container["image"]]
            process = process_of(self.spec, container, image, args=list(command))
            path = self.state / container["name"] / "probe.json"
            path.write_text(json.dumps(process))
            result = subprocess.run(
                self.runc("exec", "--process", str(path), container["name"]),
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                check=False,
            )
            results[container["name"]] = {
                "exit_code": result.returncode, "output": result.stdout + result.stderr,
                "user": process["user"], "capabilities": process["capabilities"]["effective"],
            }
        return results

    def stop(self) -> None:
        for container in [*self.spec.get("initContainers", []), *self.spec.get("containers", [])]:
            subprocess.run(self.runc("delete", "--force", container["name"]),
                           capture_output=True, check=False)
            rootfs = self.state / container["name"] / "rootfs"
            if rootfs.is_dir():
                subprocess.run(["umount", str(rootfs)], capture_output=True, check=False)
        if not self.spec.get("hostNetwork"):
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        shutil.rmtree(self.state, ignore_errors=True)
