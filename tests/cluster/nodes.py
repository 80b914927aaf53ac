"""The node under test on the stand-in API server: the shipped upgrade-protocol RBAC and
policy, the node its token is bound to, and a host root with the settings a run there gets."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from cluster.apiserver import ApiServer, Cluster
from installer.cluster import protocol
from installer.config import Config, build_config
from installer.hostroot import HostRoot
from installer.layout import Layout

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = REPO / "daemonset" / "components" / "upgrade-protocol"
RBAC = PROTOCOL / "rbac.yaml"
POLICY = PROTOCOL / "admission-policy.yaml"
NODE = "gpu-node-1"
PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
DCGM_EXPORTER = "nvidia.com/gpu.deploy.dcgm-exporter"
PAUSED = "paused-for-driver-upgrade"
LABELS = {PLUGIN: "true", DCGM_EXPORTER: "false", "kubernetes.io/hostname": NODE}
PLUGIN_PID = 4242


@dataclass
class NodeHost:
    """NODE on the stand-in server and its host root; `switch` names the setting under test."""

    cluster: Cluster
    server: ApiServer
    root: Path
    kubeconfig: Path
    switch: ClassVar[str] = "NVIDIA_INSTALLER_UPGRADE_PROTOCOL"

    def config(self, **env: str) -> Config:
        values = {self.switch: "true", "NODE_NAME": NODE,
                  "NVIDIA_INSTALLER_KUBECONFIG": str(self.kubeconfig),
                  "ROOT_MOUNT_DIR": str(self.root),
                  "NVIDIA_INSTALL_DIR_CONTAINER": str(self.root / "no-container-mount"),
                  "NVIDIA_INSTALLER_EVICTION_TIMEOUT": "30",
                  "NVIDIA_INSTALLER_HOLDERS_TIMEOUT": "30", **env}
        return build_config(values, {})

    def node(self, name: str = NODE) -> dict:
        return self.cluster.node(name)


@dataclass
class Env(NodeHost):
    """The upgrade protocol's view: the install dir, processes holding the driver, events."""

    def layout(self, config: Config) -> Layout:
        layout = Layout.from_config(config, HostRoot(config.root))
        layout.install_local.mkdir(parents=True, exist_ok=True)
        return layout

    def hold(self, pid: int, comm: str, device: str = "/dev/nvidia0") -> None:
        """A process in the host's /proc with an open fd on `device`."""
        fd_dir = self.root / "proc" / str(pid) / "fd"
        fd_dir.mkdir(parents=True, exist_ok=True)
        (self.root / "proc" / str(pid) / "comm").write_text(comm + "\n")
        os.symlink(device, fd_dir / "3")

    def exit(self, pid: int) -> None:
        shutil.rmtree(self.root / "proc" / str(pid), ignore_errors=True)

    def events(self) -> list[tuple[str, str]]:
        with self.cluster.lock:
            return [(e["reason"], e["message"]) for e in self.cluster.events]


def make_room(env: Env, config: Config) -> None:
    protocol.make_room(config, HostRoot(config.root), env.layout(config), "580.105.08",
                       "580.126.20")
