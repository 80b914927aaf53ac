"""The DaemonSet's long-running containers beside the driver (`installer fabricmanager`,
`installer persistenced`): the installer's own image and settings, the mounts their code
reads and writes, and readiness probes on the files their supervisors write."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

from deploy.manifests import (
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
