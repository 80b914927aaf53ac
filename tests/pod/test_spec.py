"""The pod spec to OCI bundle translation, on our DaemonSet, seeds/000's and GKE's shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lib.podspec import DEFAULT_CAPS, Image, PodSpecError, command_of, config_of, env_of

from pod.__main__ import image_arg, pod_spec

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "deploy" / "fixtures"
IMAGE = Image(Path("/img"), {"Entrypoint": ["installer"], "Cmd": ["run"],
                             "Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"]})


def _ours() -> dict[str, Any]:
    return pod_spec(REPO / "daemonset" / "nvidia-driver-installer.yaml")


def _by_destination(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["destination"]: m for m in config["mounts"]}


def test_command_follows_the_kubelet_rules() -> None:
    assert command_of({}, IMAGE) == ["installer", "run"]
    assert command_of({"args": ["plan"]}, IMAGE) == ["installer", "plan"]
    assert command_of({"command": ["sleep"], "args": ["infinity"]}, IMAGE) == ["sleep", "infinity"]


def test_container_env_overrides_the_images() -> None:
    env = env_of({"env": [{"name": "LANG", "value": "C"}, {"name": "X", "value": "1"}]}, IMAGE)
    assert env == ["PATH=/usr/bin:/bin", "LANG=C", "X=1"]
    with pytest.raises(PodSpecError):
        env_of({"env": [{"name": "N", "valueFrom": {"fieldRef": {}}}]}, IMAGE)


def test_privileged_init_container_of_our_daemonset(tmp_path: Path) -> None:
    spec = _ours()
    (init,) = spec["initContainers"]
    config = config_of(spec, init, IMAGE, tmp_path / "term", "/var/run/netns/p", "/k/p/i")
    process = config["process"]
    assert process["args"] == ["installer", "run"]
    assert "ROOT_MOUNT_DIR=/root" in process["env"]
    assert process["user"] == {"uid": 0, "gid": 0}
    assert "CAP_SYS_MODULE" in process["capabilities"]["effective"]
    assert process["noNewPrivileges"] is False
    assert config["linux"]["resources"]["devices"] == [{"allow": True, "access": "rwm"}]
    assert "maskedPaths" not in config["linux"]
    mounts = _by_destination(config)
    assert mounts["/root"]["source"] == "/"
    assert mounts["/dev"]["source"] == "/dev" and mounts["/dev"]["type"] == "bind"
    assert mounts["/dev/termination-log"]["source"] == str(tmp_path / "term")
    assert mounts["/sys"]["options"][-1] == "rw"
    order = [m["destination"] for m in config["mounts"]]
    assert order.index("/dev") < order.index("/dev/termination-log")
    # hostNetwork: the host's network and UTS namespaces, no hostname of its own.
    types = {n["type"] for n in config["linux"]["namespaces"]}
    assert "network" not in types and "uts" not in types and "pid" in types
    assert "hostname" not in config


def test_readiness_container_is_unprivileged(tmp_path: Path) -> None:
    spec = _ours()
    (ready,) = [c for c in spec["containers"] if c["name"] == "driver-ready"]
    config = config_of(spec, ready, IMAGE, tmp_path / "term", None, "/k/p/r")
    process = config["process"]
    assert process["args"] == ["sleep", "infinity"]
    assert process["user"] == {"uid": 65534, "gid": 65534}
    assert process["capabilities"]["effective"] == []
    assert process["noNewPrivileges"] is True
    assert config["root"]["readonly"] is True
    assert config["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]
    assert config["linux"]["resources"]["memory"] == {"limit": 64 << 20}
    assert "/proc/kcore" in config["linux"]["maskedPaths"]
    mounts = _by_destination(config)
    assert mounts["/run/nvidia-driver-installer"]["options"][-1] == "ro"
    assert mounts["/sys"]["options"][-1] == "ro"
    assert mounts["/dev"]["type"] == "tmpfs"


def test_gke_shape_shares_no_host_namespace(tmp_path: Path) -> None:
    spec = pod_spec(FIXTURES / "gke-ubuntu-daemonset.yaml")
    assert "hostPID" not in spec and "hostNetwork" not in spec
    (init,) = spec["initContainers"]
    config = config_of(spec, init, IMAGE, tmp_path / "t", "/var/run/netns/p", "/k/p/i")
    namespaces = {n["type"]: n.get("path") for n in config["linux"]["namespaces"]}
    assert namespaces["pid"] is None
    assert namespaces["network"] == "/var/run/netns/p"
    assert "/run" not in _by_destination(config)
    assert config["process"]["args"] == ["installer", "run"]  # no command in GKE's manifest


def test_default_capabilities_less_dropped_plus_added(tmp_path: Path) -> None:
    spec = {"containers": []}
    container = {"name": "c", "image": "i",
                 "securityContext": {"capabilities": {"drop": ["NET_RAW"], "add": ["SYS_ADMIN"]}}}
    caps = config_of(spec, container, IMAGE, tmp_path, None, "/c")["process"]["capabilities"]
    assert caps["bounding"] == [c for c in DEFAULT_CAPS if c != "CAP_NET_RAW"] + ["CAP_SYS_ADMIN"]


def test_run_as_non_root_with_uid_0_is_refused(tmp_path: Path) -> None:
    container = {"name": "c", "image": "i", "securityContext": {"runAsNonRoot": True}}
    with pytest.raises(PodSpecError):
        config_of({}, container, IMAGE, tmp_path, None, "/c")


def test_image_argument(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"Entrypoint": ["/pause"]}')
    ref, image = image_arg(f"registry.example.com:5000/pause:3.1={tmp_path}/rootfs:{config}")
    assert ref == "registry.example.com:5000/pause:3.1"
    assert image == Image(tmp_path / "rootfs", {"Entrypoint": ["/pause"]})


def test_seed000_runs_verbatim_but_for_the_image() -> None:
    doc = yaml.safe_load((FIXTURES / "seed000-jdcloud-daemonset.yaml").read_text())
    spec = pod_spec(FIXTURES / "seed000-jdcloud-daemonset.yaml")
    assert spec["initContainers"] == doc["spec"]["template"]["spec"]["initContainers"]


def test_host_path_types_follow_the_kubelet(tmp_path: Path) -> None:
    from pod.run import HostPathError, Pod

    spec = {"volumes": [
        {"name": "made", "hostPath": {"path": str(tmp_path / "a/b"), "type": "DirectoryOrCreate"}},
        {"name": "any", "hostPath": {"path": str(tmp_path / "absent")}},
    ]}
    Pod(spec, {}, tmp_path / "state").host_paths()
    assert (tmp_path / "a/b").is_dir() and not (tmp_path / "absent").exists()
    spec["volumes"].append({"name": "dir", "hostPath": {"path": str(tmp_path / "x"),
                                                        "type": "Directory"}})
    with pytest.raises(HostPathError):
        Pod(spec, {}, tmp_path / "state").host_paths()
