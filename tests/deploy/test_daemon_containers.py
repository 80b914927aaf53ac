"""The DaemonSet's long-running containers beside the driver (`installer fabricmanager`,
`installer persistenced`): the installer's own image and settings, the mounts their code
reads and writes, and readiness probes on the files their supervisors write."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest
from lib.manifests import (
    container_env,
    installer_container,
    installer_daemonset,
    pod_spec,
    shipped,
)

from installer.components import persistenced
from installer.components.supervisor import ready_file
from installer.config import from_env, known_env_vars


def daemon_containers(ds: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_spec(ds)["containers"]
            if c["name"] in ("fabricmanager", "persistenced")}


@pytest.mark.parametrize("source", ["base", "rendered"])
def test_each_daemon_runs_its_installer_command_with_the_installers_settings(
        source: str) -> None:
    ds = installer_daemonset(shipped(source))
    init = installer_container(ds)
    init_env = container_env(init)
    spec = pod_spec(ds)
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    containers = daemon_containers(ds)
    assert sorted(containers) == ["fabricmanager", "persistenced"]
    for name, container in containers.items():
        assert container["image"] == init["image"]
        assert container["args"] == [name] and "command" not in container
        assert container["securityContext"] == {"privileged": True}
        env = container_env(container)
        assert set(env) <= known_env_vars()
        config = from_env(env)
        # The same install dir, host root and readiness dir as the installer that wrote them.
        for key in ("NVIDIA_INSTALL_DIR_HOST", "NVIDIA_INSTALL_DIR_CONTAINER", "ROOT_MOUNT_DIR"):
            assert env[key] == init_env[key], key
        mounts = {m["mountPath"]: (volumes[m["name"]], m.get("readOnly", False))
                  for m in container["volumeMounts"]}
        assert mounts[str(config.root)] == ("/", False)
        assert mounts[str(config.install_dir_container)] == (str(config.install_dir_host), True)
        assert mounts["/dev"] == ("/dev", False)
        marker = ready_file(name)
        assert mounts[str(marker.parent)] == (str(marker.parent), False)  # writes its marker
        probe = container["readinessProbe"]["exec"]["command"]
        assert probe == ["test", "-f", str(marker)]
        assert "cpu" not in container["resources"].get("limits", {})
        assert "memory" not in container["resources"].get("limits", {})
    run_dir = PurePosixPath(str(persistenced.RUN_DIR))
    mounts = {m["mountPath"]: volumes[m["name"]]
              for m in containers["persistenced"]["volumeMounts"]}
    # The socket the daemon makes in its compiled-in /var/run path lands on the node.
    assert mounts[str(run_dir)] == "/run/nvidia-persistenced"


def test_the_imex_component_adds_installer_imex_with_its_socket_in_the_driver_root() -> None:
    """daemonset/components/imex: `installer imex` with the installer's settings; IMEX's
    directory (config, nodes file, command socket) writable at the place inside the install
    dir where the DRA driver's plugin asks; the nodes from the optional ConfigMap; the probe
    on the file its supervisor writes."""
    from lib.manifests import DAEMONSET_DIR, render

    from installer.components import imexd
    from installer.hostroot import HostRoot
    from installer.layout import Layout

    ds = installer_daemonset(render(DAEMONSET_DIR / "examples" / "imex-host-managed"))
    init_env = container_env(installer_container(ds))
    spec = pod_spec(ds)
    volumes = {v["name"]: v for v in spec["volumes"]}
    imex = next(c for c in spec["containers"] if c["name"] == "imex")
    assert imex["args"] == ["imex"] and imex["image"] == installer_container(ds)["image"]
    env = container_env(imex)
    assert set(env) <= known_env_vars()
    for key in ("NVIDIA_INSTALL_DIR_HOST", "NVIDIA_INSTALL_DIR_CONTAINER", "ROOT_MOUNT_DIR"):
        assert env[key] == init_env[key], key
    config = from_env(env)
    mounts = {m["mountPath"]: (m["name"], m.get("readOnly", False))
              for m in imex["volumeMounts"]}
    # The socket's directory, as this container's code computes it (inside the install dir;
    # in the pod that is NVIDIA_INSTALL_DIR_CONTAINER), is a writable mount of the same
    # directory of the install dir on the host.
    layout = Layout.from_config(config, HostRoot(config.root))
    inside = imexd.ImexDaemon(config, HostRoot(config.root)).socket_path.parent.relative_to(
        layout.install_local)
    assert inside == PurePosixPath("etc/nvidia-imex")
    assert mounts[f"{config.install_dir_container}/{inside}"] == ("imex-etc", False)
    assert volumes["imex-etc"]["hostPath"]["path"] == f"{layout.install_host}/{inside}"
    # The nodes: the ConfigMap's key, where NVIDIA_IMEX_NODES points; optional, so a missing
    # ConfigMap stops this container only.
    nodes = PurePosixPath(config.imex_nodes or "")
    assert mounts[str(nodes.parent)] == ("imex-nodes", True)
    assert volumes["imex-nodes"]["configMap"] == {"name": "nvidia-imex-nodes", "optional": True}
    assert nodes.name == "nodes_config.cfg"
    assert imex["readinessProbe"]["exec"]["command"] == ["test", "-f", str(ready_file("imex"))]
