"""The node-pools example (daemonset/examples/node-pools): one DaemonSet, the pool policy mounted
from its ConfigMap where NVIDIA_INSTALLER_POOL_POLICY says, the upgrade protocol's identity to
read the node, and two pools that resolve to two driver branches."""

from __future__ import annotations

from pathlib import PurePosixPath

from lib.manifests import (
    DAEMONSET_DIR,
    container_env,
    installer_container,
    installer_daemonset,
    pod_spec,
    render,
)

from installer.cluster import pools
from installer.config import from_env
from installer.host import PciGpu
from installer.release import catalog, versions


def test_one_daemonset_mounts_the_policy_that_puts_two_pools_on_two_branches() -> None:
    docs = render(DAEMONSET_DIR / "examples" / "node-pools")
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len([d for d in docs if d["kind"] == "DaemonSet"]) == 1
    ds = installer_daemonset(docs)
    container = installer_container(ds)
    env = container_env(container)
    config = from_env(env)
    assert config.upgrade_protocol and config.pool_policy

    # The setting names a file of the ConfigMap's volume, read-only.
    policy_path = PurePosixPath(config.pool_policy)
    (mount,) = [m for m in container["volumeMounts"]
                if PurePosixPath(m["mountPath"]) == policy_path.parent]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod_spec(ds)["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert configmap["metadata"]["namespace"] == ds["metadata"]["namespace"]
    text = configmap["data"][policy_path.name]
    # The pod has a token to read its own Node with (the upgrade protocol's identity).
    assert pod_spec(ds)["automountServiceAccountToken"] is True

    # What the installer makes of it: the training pool on R595, every other node on R580.
    policy = pools.parse(text, "example")
    h100 = [PciGpu("0000:17:00.0", 0x2330, 0x030200)]
    chosen = {}
    for labels in ({"cloud.google.com/gke-nodepool": "training"},
                   {"cloud.google.com/gke-nodepool": "default-pool"}):
        rule = pools.choose(policy, labels, "node").rule
        assert rule is not None and rule.version is not None
        resolved = versions.resolve(rule.version, catalog.shipped(), h100)
        chosen[rule.name] = (resolved.branch, rule.max_upgrading)
    assert chosen == {"training": (595, 2), "inference": (580, 1)}
