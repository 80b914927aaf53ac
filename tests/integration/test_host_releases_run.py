"""`installer run` on posed host releases (tests/lib/hosts/*.json), one per family shape: Ubuntu
24.04 and 26.04 (apt), Oracle Linux 9 on UEK and Rocky 10 (dnf); Amazon Linux 2023 through its dnf
source is test_dnf_amazon.py. Each run goes through the family's own code: the kernel's headers
package fetched with the real apt-get or dnf from the host's own (signed, 127.0.0.1) sources, then
the kit's strict nvidia-installer builds the kit's modules with real kbuild against them.

Where the header packages come from: this machine's real Debian 6.1 trees repackaged under the
posed kernel release, in each distribution's package names and layout (lib/headerrepos.py: Ubuntu's
flavour package with its kbuild scripts and links into the `linux-headers-<abi>` common package it
Depends on; the EL rebuilds' one flat tree in /usr/src/kernels/<uname -r>, named kernel-uek-devel
on UEK), UTS_RELEASE set to the posed release. The trees were built with Debian's gcc 12, so gcc 12
stands in for each kernel's own compiler (Ubuntu 24.04's 13, 26.04's 15, EL's 11 and 14: those are
tests/integration/test_host_releases.py's plan checks). As in the rest of the integration tier
nothing is loaded: the host runs another kernel and the run builds ahead for the posed one (loading
is the vm tier's)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import kit
import pytest
from lib import hostreleases
from lib.headerrepos import (
    kernel_devel_rpm,
    make_key,
    publish_apt,
    publish_dnf,
    ubuntu_shape_debs,
)
from lib.hostkit import INSTALL_DIR_HOST, RUNNING_KERNEL, installer_env, run_installer
from lib.hostreleases import PosedHost
from lib.hostshapes import release_sources, write_release_os_release
from lib.hosttrees import add_gpus, make_host
from lib.httpfaults import serve_directory
from lib.marks import needs_headers

_TOOLS = ("apt-get", "dpkg-deb", "dpkg-scanpackages", "gpg", "dnf", "rpmbuild", "rpmsign",
          "createrepo_c", "rpm2cpio", "cpio", "unshare", "makeself")
pytestmark = [needs_headers, pytest.mark.skipif(
    any(shutil.which(t) is None for t in _TOOLS) and not os.environ.get("CI"),
    reason="needs " + ", ".join(_TOOLS))]

VERSION = "580.105.08"  # where the release names no driver_version of its own
# One posed host (tests/lib/hosts/*.json) per family shape: the build is minutes a host.
SHAPES = {name: host for name, host in hostreleases.posed_hosts().items()
          if name in ("noble-generic", "resolute-generic", "ol9-uek", "rocky10")}


def version_of(host: PosedHost) -> str:
    return host.release.driver_version or VERSION


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
    for name, (release, kernel) in SHAPES.items():
        if kernel.common_package:
            # CONFIG_GCC_VERSION 120200: this machine's gcc 12 built the trees (module doc).
            debs = ubuntu_shape_debs(work / name, kernel.release, kernel.common_package, 120200)
            publish_apt(www / "ubuntu", release.codename, debs, key)
        else:
            publish_dnf(www / kernel.repo, [kernel_devel_rpm(
                work / name, kernel.release, key, kernel.package_name)])
    # The other repos the hosts' files name, empty (dnf reads each).
    for where in sorted({repo for release, _ in SHAPES.values() for repo in release.repos}):
        if not (www / where / "repodata").is_dir():
            publish_dnf(www / where, [])
    for version in sorted({version_of(host) for host in SHAPES.values()}):
        kit.build_runfile(version, www / "runfiles" / version)
    digests = kit.write_digests(work / "digests", www / "runfiles")
    with serve_directory(www) as (base, requests):
        yield Archive(base, key, digests, requests)


def posed(tmp_path: Path, host: PosedHost, archive: Archive) -> Path:
    """A node of the host's release with an H100, its own package sources and keys, running
    another kernel than the one the run builds for."""
    root = tmp_path / "host"
    make_host(root, kernel=RUNNING_KERNEL)
    write_release_os_release(root, host.release)  # over make_host's default release's
    add_gpus(root, (0x2330,))
    (root / "proc/sys/kernel/arch").write_text("x86_64\n")
    (root / "lib/modules" / host.kernel.release).mkdir(parents=True)
    (root / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/modprobe.d").mkdir(parents=True, exist_ok=True)
    release_sources(root, host.release, "x86_64", archive.base, archive.key)
    return root


def vermagic(module: Path) -> str:
    data = module.read_bytes()
    start = data.index(b"vermagic=") + len(b"vermagic=")
    return data[start:data.index(b"\0", start)].decode()


@pytest.mark.parametrize("name", list(SHAPES))
def test_run_fetches_the_familys_headers_and_builds_against_them(
        archive: Archive, tmp_path: Path, name: str) -> None:
    host = SHAPES[name]
    kernel = host.kernel
    version = version_of(host)
    root = posed(tmp_path, host, archive)
    env = installer_env(root, kernel.release, NVIDIA_DRIVER_VERSION=version,
                        NVIDIA_DRIVER_MIRRORS=f"{archive.base}/runfiles",
                        NVIDIA_DRIVER_DIGESTS_FILE=str(archive.digests),
                        NVIDIA_INSTALLER_FETCH_HEADERS="true")
    archive.requests.clear()
    result = run_installer(env, "run", timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]

    install = root / INSTALL_DIR_HOST.lstrip("/")
    cache = install / "cache/headers" / kernel.release
    fetched = (cache / ".complete").read_text().split()
    assert fetched == ([kernel.headers_package, kernel.common_package] if kernel.common_package
                       else [kernel.headers_package])
    downloads = [r for r in archive.requests if r.endswith((".deb", ".rpm"))]
    first_runfile = next(i for i, r in enumerate(archive.requests) if r.endswith(".run"))
    assert downloads and all(archive.requests.index(d) < first_runfile for d in downloads)
    # Real kbuild built the kit's modules against the fetched tree: their vermagic is the
    # posed kernel's, and they are installed in the install dir for it.
    modules = sorted(p.name for p in (install / "drivers").glob("*.ko"))
    assert "nvidia.ko" in modules and "nvidia-uvm.ko" in modules, modules
    for module in modules:
        assert vermagic(install / "drivers" / module).startswith(f"{kernel.release} SMP"), module
    record = json.loads((install / "state.json").read_text())
    assert (record["version"], record["kernel"], record["source"]) == (
        version, kernel.release, "runfile")
    assert (install / "bin/nvidia-smi").is_file()
    # The host's package databases were never touched: the fetch used its own.
    for path in ("var/lib/dpkg", "var/lib/apt", "var/lib/rpm", "var/lib/dnf", "var/cache"):
        assert not (root / path).exists(), path

    archive.requests.clear()
    again = run_installer(env, "run", timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "every step was already satisfied" in again.stderr
    assert archive.requests == []
