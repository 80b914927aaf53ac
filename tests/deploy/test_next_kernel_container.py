"""The DaemonSet's next-kernel container: the initContainer leaves the next kernel to
it (the pod turns Ready without that compile), and it sees the host and the install dir exactly
as the initContainer does, with settings the installer accepts."""

from __future__ import annotations

from typing import Any

from lib.manifests import (
    DAEMONSET_DIR,
    container_env,
    host_path_of,
    installer_container,
    installer_daemonset,
    load_all,
    pod_spec,
    render,
)

from installer.config import from_env, known_env_vars


def next_kernel_container(ds: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in pod_spec(ds)["containers"] if c["name"] == "next-kernel"]
    return found


def test_the_init_container_leaves_the_next_kernel_to_the_long_running_one() -> None:
    ds = installer_daemonset(load_all(DAEMONSET_DIR / "base" / "daemonset.yaml"))
    init, watcher = installer_container(ds), next_kernel_container(ds)
    assert from_env(container_env(init)).next_kernel == "separate"
    assert "command" not in watcher, "the image's entrypoint is `installer`"
    assert watcher["args"] == ["prepare-next-kernel", "--watch"]
    assert watcher["image"] == init["image"]
    assert watcher["securityContext"] == {"privileged": True}  # mounts headers, compiles
    assert "limits" not in watcher["resources"]
    assert "readinessProbe" not in watcher  # readiness stays the driver's
    env = container_env(watcher)
    assert set(env) <= known_env_vars()
    config, init_config = from_env(env), from_env(container_env(init))
    assert config.next_kernel == "separate"
    for name in ("root", "install_dir_host", "install_dir_container"):
        assert getattr(config, name) == getattr(init_config, name), name
    for path in (str(config.root), str(config.install_dir_container)):
        assert host_path_of(ds, watcher, path) == host_path_of(ds, init, path) is not None


def test_the_module_registry_overlay_gives_the_container_the_registry_too() -> None:
    ds = installer_daemonset(render(DAEMONSET_DIR / "overlays" / "module-registry"))
    init, watcher = installer_container(ds), next_kernel_container(ds)
    registry = {k: v for k, v in container_env(init).items() if "REGISTRY" in k or "TRUST" in k}
    assert registry and {k: v for k, v in container_env(watcher).items()
                         if "REGISTRY" in k or "TRUST" in k} == registry
    config = from_env(container_env(watcher))
    # Pulls what the builder signed, like the initContainer; nodes never publish: a node's
    # credentials must not be able to put modules on other nodes.
    assert config.module_trusted_keys is not None and config.module_registry_push is False
    for path in (str(config.module_trusted_keys.parent),
                 str(config.module_registry_password_file.parent)):  # type: ignore[union-attr]
        assert [m for m in watcher["volumeMounts"] if m["mountPath"] == path] == [
            m for m in init["volumeMounts"] if m["mountPath"] == path] != []
