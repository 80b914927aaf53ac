"""Drop-in check: the DaemonSets users run today (seeds/000 JD Cloud, seeds/001 modified GKE) work
with our image when only `image:` changes, and so do ours: every env var is one the installer
knows and accepts, and the mounts give it the host's /, the install dir and /dev."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from lib.manifests import (
    DAEMONSET_DIR,
    FIXTURES,
    K8S_VERSIONS,
    container_env,
    contract_problems,
    installer_container,
    installer_daemonset,
    kustomization_dirs,
    load_all,
    render,
)

OUR_IMAGE = "registry.example.com/nvidia-driver-installer:0.1.0-ubuntu24.04"
SEEDS = sorted(FIXTURES.glob("seed*-daemonset.yaml"))


def _seed_with_our_image(path: Path) -> dict[str, Any]:
    ds = installer_daemonset(load_all(path))
    installer_container(ds)["image"] = OUR_IMAGE
    return ds


def test_both_seed_daemonsets_are_fixtures() -> None:
    assert [p.name for p in SEEDS] == [
        "seed000-jdcloud-daemonset.yaml",
        "seed001-gke-modified-daemonset.yaml",
    ]


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_seed_daemonset_with_only_the_image_changed_fits_the_installer(path: Path) -> None:
    ds = _seed_with_our_image(path)
    assert contract_problems(ds) == []


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_seed_daemonset_with_our_image_is_valid_kubernetes(path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(_seed_with_our_image(path), K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_ours_replaces_a_seed_in_place(path: Path) -> None:
    """Same name, namespace and selector: `kubectl apply` updates theirs instead of failing on
    the immutable selector or leaving two installers racing on one node."""
    seed = installer_daemonset(load_all(path))
    ours = installer_daemonset(load_all(DAEMONSET_DIR / "base" / "daemonset.yaml"))
    for key in ("name", "namespace"):
        assert ours["metadata"][key] == seed["metadata"][key]
    assert ours["spec"]["selector"] == seed["spec"]["selector"]
    # Ours sets everything theirs sets, to the same value (and pins the version on top).
    seed_env = container_env(installer_container(seed))
    our_env = container_env(installer_container(ours))
    assert {k: our_env.get(k) for k in seed_env} == seed_env


@pytest.mark.parametrize(
    "path",
    [DAEMONSET_DIR / "base" / "daemonset.yaml", DAEMONSET_DIR / "nvidia-driver-installer.yaml"],
    ids=["base", "rendered"],
)
def test_our_manifest_fits_the_installer(path: Path) -> None:
    assert contract_problems(installer_daemonset(load_all(path))) == []


@pytest.mark.parametrize(
    "directory", kustomization_dirs(), ids=[p.name for p in kustomization_dirs()]
)
def test_every_kustomization_fits_the_installer(directory: Path) -> None:
    assert contract_problems(installer_daemonset(render(directory))) == []


# The checker itself must be able to fail, or the tests above prove nothing.


def _base() -> dict[str, Any]:
    return copy.deepcopy(installer_daemonset(load_all(DAEMONSET_DIR / "base" / "daemonset.yaml")))


def _base_with_env(name: str, value: str) -> dict[str, Any]:
    """The base DaemonSet with its installer container's env var `name` (one it sets) set to
    `value`."""
    ds = _base()
    (item,) = [e for e in installer_container(ds)["env"] if e["name"] == name]
    item["value"] = value
    return ds


def test_checker_reports_an_unknown_env_var() -> None:
    ds = _base()
    installer_container(ds)["env"].append({"name": "NVIDIA_DRIVER_VERSIONS", "value": "580"})
    assert contract_problems(ds) == ["env vars the installer does not know: NVIDIA_DRIVER_VERSIONS"]


def test_checker_reports_a_value_from_env_rejects() -> None:
    ds = _base_with_env("NVIDIA_INSTALL_DIR_HOST", "home/kubernetes/bin/nvidia")
    (problem,) = contract_problems(ds)
    assert problem.startswith("from_env rejects the env: NVIDIA_INSTALL_DIR_HOST")


@pytest.mark.parametrize("mount", ["root-mount", "nvidia-install-dir-host", "dev"])
def test_checker_reports_a_missing_mount(mount: str) -> None:
    ds = _base()
    container = installer_container(ds)
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != mount]
    (problem,) = contract_problems(ds)
    assert "got None" in problem


def test_checker_reports_the_root_mounted_elsewhere() -> None:
    (problem,) = contract_problems(_base_with_env("ROOT_MOUNT_DIR", "/host"))
    assert problem.startswith("ROOT_MOUNT_DIR: expected host / mounted read-write at /host")


def test_checker_reports_an_unprivileged_installer() -> None:
    ds = _base()
    installer_container(ds)["securityContext"] = {"privileged": False}
    assert contract_problems(ds) == ["the installer container is not privileged"]


def test_checker_refuses_a_read_only_install_dir() -> None:
    ds = _base()
    for mount in installer_container(ds)["volumeMounts"]:
        if mount["name"] == "nvidia-install-dir-host":
            mount["readOnly"] = True
    (problem,) = contract_problems(ds)
    assert problem.startswith("the install dir:")
