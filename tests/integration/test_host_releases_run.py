"""`installer run` on posed hosts of 2026, one per family shape: Ubuntu 24.04 and 26.04 (apt),
Oracle Linux 9 on UEK and Rocky 10 (dnf); Amazon Linux 2023 through its dnf source is
test_dnf_amazon.py. Each run goes through the family's own code: the kernel's headers package
fetched with the real apt-get or dnf from the host's own (signed, 127.0.0.1) sources, then the
kit's strict nvidia-installer builds the kit's modules with real kbuild against them.

Where the header packages come from: this machine's real Debian 6.1 trees repackaged under the
posed kernel release, in each distribution's package names and layout (lib/headerrepos.py:
Ubuntu's flavour package with its kbuild scripts and links into the `linux-headers-<abi>`
common package it Depends on; the EL rebuilds' one flat tree in /usr/src/kernels/<uname -r>,
named kernel-uek-devel on UEK), UTS_RELEASE set to the posed release. The trees were built with
Debian's gcc 12, so gcc 12 stands in for each kernel's own compiler (Ubuntu 24.04's 13, 26.04's
15, EL's 11 and 14: those are tests/integration/test_host_releases.py's plan checks). As in the
rest of the integration tier nothing is loaded: the host runs another kernel and the run builds
ahead for the posed one (loading is the vm tier's)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import kit
import pytest
from lib.headerrepos import (
    kernel_devel_rpm,
    make_key,
    publish_apt,
    publish_dnf,
    rocky_repos,
    ubuntu_shape_debs,
)
from lib.hostkit import INSTALL_DIR_HOST, RUNNING_KERNEL, installer_env, run_installer
from lib.hostshapes import oracle_repos, ubuntu_sources
from lib.hosttrees import add_gpus, make_host
from lib.httpfaults import serve_directory
from lib.marks import needs_headers

_TOOLS = ("apt-get", "dpkg-deb", "dpkg-scanpackages", "gpg", "dnf", "rpmbuild", "rpmsign",
          "createrepo_c", "rpm2cpio", "cpio", "unshare", "makeself")
pytestmark = [needs_headers, pytest.mark.skipif(
    any(shutil.which(t) is None for t in _TOOLS) and not os.environ.get("CI"),
    reason="needs " + ", ".join(_TOOLS))]

VERSION = "580.105.08"
# Ubuntu 26.04 and kernel 7.0 take 595.91.07 or newer (installer/release/data/floors.json).
RESOLUTE_VERSION = "595.91.07"


class Shape(NamedTuple):
    distro: str
    kernel: str
    package: str  # the headers package the family names and fetches
    common: str  # Ubuntu: the common package it Depends on; EL: ""


SHAPES = {
    "noble-generic": Shape("ubuntu-24.04", "6.8.0-87-generic", "linux-headers-6.8.0-87-generic",
                           "linux-headers-6.8.0-87"),
    "resolute-generic": Shape("ubuntu-26.04", "7.0.0-15-generic",
                              "linux-headers-7.0.0-15-generic", "linux-headers-7.0.0-15"),
    "ol9-uek": Shape("ol-9", "6.12.0-105.51.5.el9uek.x86_64",
                     "kernel-uek-devel-6.12.0-105.51.5.el9uek.x86_64", ""),
    "rocky10": Shape("rocky-10", "6.12.0-55.12.1.el10_0.x86_64",
                     "kernel-devel-6.12.0-55.12.1.el10_0.x86_64", ""),
}
SUITES = {"ubuntu-24.04": "noble", "ubuntu-26.04": "resolute"}
ROCKY10 = {"baseos": "rocky/10/BaseOS/$basearch/os/",
           "appstream": "rocky/10/AppStream/$basearch/os/"}


class Archive(NamedTuple):
    base: str
    key: Any
    digests: Path
    requests: list[str]


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archive]:
    """Ubuntu's noble and resolute suites, Oracle Linux 9's UEKR8 channel and Rocky 10's
    AppStream (each with its sibling repos, empty), and the kit's .run."""
    work = tmp_path_factory.mktemp("host-releases-run")
    www = work / "www"
    key = make_key(work / "key")
    for name, shape in SHAPES.items():
        if shape.common:
            # CONFIG_GCC_VERSION 120200: this machine's gcc 12 built the trees (module doc).
            debs = ubuntu_shape_debs(work / name, shape.kernel, shape.common, 120200)
            publish_apt(www / "ubuntu", SUITES[shape.distro], debs, key)
    publish_dnf(www / "repo/OracleLinux/OL9/UEKR8/x86_64", [kernel_devel_rpm(
        work / "uek", SHAPES["ol9-uek"].kernel, key, "kernel-uek-devel")])
    publish_dnf(www / "rocky/10/AppStream/x86_64/os", [kernel_devel_rpm(
        work / "el10", SHAPES["rocky10"].kernel, key)])
    for empty in ("repo/OracleLinux/OL9/baseos/latest/x86_64",
                  "repo/OracleLinux/OL9/appstream/x86_64", "rocky/10/BaseOS/x86_64/os"):
        publish_dnf(www / empty, [])
    for version in (VERSION, RESOLUTE_VERSION):
        kit.build_runfile(version, www / "runfiles" / version)
    digests = kit.write_digests(work / "digests", www / "runfiles")
    with serve_directory(www) as (base, requests):
        yield Archive(base, key, digests, requests)


def posed(tmp_path: Path, shape: Shape, archive: Archive) -> Path:
    """A node of the shape's release with an H100, its own package sources and keys, running
    another kernel than the one the run builds for."""
    root = tmp_path / "host"
    make_host(root, distro=shape.distro, kernel=RUNNING_KERNEL)
    add_gpus(root, (0x2330,))
    (root / "proc/sys/kernel/arch").write_text("x86_64\n")
    (root / "lib/modules" / shape.kernel).mkdir(parents=True)
    (root / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/modprobe.d").mkdir(parents=True, exist_ok=True)
    major = int(shape.distro.split("-")[1].split(".")[0])
    if shape.common:
        ubuntu_sources(root, archive.base, SUITES[shape.distro], archive.key, "x86_64")
    elif shape.distro.startswith("ol-"):
        oracle_repos(root, major, archive.base, archive.key)
    else:
        rocky_repos(root, major, archive.base, archive.key, ROCKY10)
    return root


def vermagic(module: Path) -> str:
    data = module.read_bytes()
    start = data.index(b"vermagic=") + len(b"vermagic=")
    return data[start:data.index(b"\0", start)].decode()


@pytest.mark.parametrize("name", list(SHAPES))
def test_run_fetches_the_familys_headers_and_builds_against_them(
        archive: Archive, tmp_path: Path, name: str) -> None:
    shape = SHAPES[name]
    version = RESOLUTE_VERSION if shape.distro == "ubuntu-26.04" else VERSION
    root = posed(tmp_path, shape, archive)
    env = installer_env(root, shape.kernel, NVIDIA_DRIVER_VERSION=version,
                        NVIDIA_DRIVER_MIRRORS=f"{archive.base}/runfiles",
                        NVIDIA_DRIVER_DIGESTS_FILE=str(archive.digests),
                        NVIDIA_INSTALLER_FETCH_HEADERS="true")
    archive.requests.clear()
    result = run_installer(env, "run", timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]

    install = root / INSTALL_DIR_HOST.lstrip("/")
    cache = install / "cache/headers" / shape.kernel
    fetched = (cache / ".complete").read_text().split()
    assert fetched == ([shape.package, shape.common] if shape.common else [shape.package])
    downloads = [r for r in archive.requests if r.endswith((".deb", ".rpm"))]
    first_runfile = next(i for i, r in enumerate(archive.requests) if r.endswith(".run"))
    assert downloads and all(archive.requests.index(d) < first_runfile for d in downloads)
    # Real kbuild built the kit's modules against the fetched tree: their vermagic is the
    # posed kernel's, and they are installed in the install dir for it.
    modules = sorted(p.name for p in (install / "drivers").glob("*.ko"))
    assert "nvidia.ko" in modules and "nvidia-uvm.ko" in modules, modules
    for module in modules:
        assert vermagic(install / "drivers" / module).startswith(f"{shape.kernel} SMP"), module
    record = json.loads((install / "state.json").read_text())
    assert (record["version"], record["kernel"], record["source"]) == (
        version, shape.kernel, "runfile")
    assert (install / "bin/nvidia-smi").is_file()
    # The host's package databases were never touched: the fetch used its own.
    for path in ("var/lib/dpkg", "var/lib/apt", "var/lib/rpm", "var/lib/dnf", "var/cache"):
        assert not (root / path).exists(), path

    archive.requests.clear()
    again = run_installer(env, "run", timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "every step was already satisfied" in again.stderr
    assert archive.requests == []
