"""The Debian 12 product image built for real for linux/amd64 and linux/arm64 (tests/pod/
multiarch.py): images/build.sh makes one manifest list of both; the arm64 image's files are aarch64
ELF, and the installer runs in the arm64 root under qemu-user (`--version`, `plan` of a Grace-like
Debian 12 arm64 host posed inside it). One build, many assertions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
from lib.hostshapes import header_tree, pose_host
from lib.podimage import REPO, TOOLS

from pod.multiarch import CachedBuildah, ManifestList, binfmt_problem, build_manifest_list

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
HEAD = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                      text=True, check=False).stdout.strip() or "unknown"
KERNEL = "6.1.0-47-arm64"
PROC_VERSION = (f"Linux version {KERNEL} (debian-kernel@lists.debian.org) (gcc-12 (Debian "
                "12.2.0-14+deb12u1) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP Debian "
                "6.1.158-1 (2025-11-09)\n")
MACHINE = {183: "aarch64", 62: "x86-64"}  # ELF e_machine


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "buildah (vfs, chroot isolation) and chroot need root"
    for tool in (*TOOLS, "arch-test"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install-deps)"
    return binfmt_problem()


_MISSING = _missing()
# Off CI a machine without the tools skips; CI fails, naming what is missing (binfmt included).
pytestmark = pytest.mark.skipif(bool(_MISSING) and not os.environ.get("CI"),
                                reason=_MISSING or "")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManifestList]:
    if _MISSING:
        pytest.fail(_MISSING, pytrace=False)
    work = tmp_path_factory.mktemp("multiarch")
    buildah = CachedBuildah()
    try:
        yield build_manifest_list(buildah, work)
    finally:
        buildah.remove()
        buildah.release()


def machine_of(rootfs: Path, path: str) -> str:
    """The ELF machine of `path` in the image, its symlinks followed inside the image's root."""
    here = Path(path)
    for _ in range(40):
        target = rootfs / here.relative_to("/")
        if not target.is_symlink():
            break
        link = Path(os.readlink(target))
        here = link if link.is_absolute() else here.parent / link
    header = target.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", f"{path} ({here}) is not an ELF file"
    return MACHINE.get(int.from_bytes(header[18:20], "little"), f"e_machine {header[18:20]!r}")


def in_arm64_root(built: ManifestList, *argv: str,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` chrooted into the arm64 image's root: every binary there runs under qemu-aarch64."""
    rootfs = built.images["linux/arm64"].rootfs
    base = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8"}
    return subprocess.run(["chroot", str(rootfs), "/usr/bin/env", "-i",
                           *(f"{k}={v}" for k, v in {**base, **(env or {})}.items()), *argv],
                          capture_output=True, text=True, timeout=600, check=False)


def test_build_sh_made_one_manifest_list_of_both_platforms(built: ManifestList) -> None:
    ref = f"registry.example.com/nvidia-driver-installer:{VERSION}-debian12"
    assert built.ref == ref
    builds = [line for line in built.log.splitlines() if re.match(r"\+ buildah .* build ", line)]
    assert [re.search(r"--platform (\S+)", b)[1] for b in builds] == ["linux/amd64", "linux/arm64"]
    assert all(f"--manifest {ref} " in b for b in builds)
    platforms = sorted((m["platform"]["os"], m["platform"]["architecture"])
                       for m in built.manifest["manifests"])
    assert platforms == [("linux", "amd64"), ("linux", "arm64")]
    assert len({m["digest"] for m in built.manifest["manifests"]}) == 2
    print(f"\nimages/build.sh, both platforms: {built.seconds:.0f} s ({built.cached_steps} cached "
          f"steps before); mmdebstrap: {built.base_seconds}")


def test_a_warm_cache_skips_both_platforms_apt_steps(built: ManifestList) -> None:
    """With the cached steps of an earlier run in the storage, neither stage's apt step runs
    again for either platform (the Dockerfile declares the per-commit arguments after them)."""
    if not built.warm:
        pytest.skip("no earlier build finished with this cache: this run stored the steps for "
                    "the next")
    assert "Reading package lists" not in built.log
    assert len(re.findall(r"^--> Using cache ", built.log, re.M)) >= 4, built.log[-3000:]


def test_each_image_config_names_its_architecture(built: ManifestList) -> None:
    for platform, image in built.images.items():
        assert image.config["architecture"] == platform.split("/")[1]
        assert image.config["Entrypoint"] == ["installer"]
        assert image.config["Cmd"] == ["run"]
        # This commit's, though the layers before them may come from the cache.
        labels = image.config["Labels"]
        assert labels["org.opencontainers.image.version"] == VERSION
        assert labels["org.opencontainers.image.revision"] == HEAD


@pytest.mark.parametrize("path", [
    "/opt/installer/bin/python3",              # the installer's venv
    "/usr/bin/gcc-12",                         # the kernel's compiler, and its cc1
    "/usr/bin/gcc",
    "/usr/lib/gcc/{triplet}/12/cc1",
    "/usr/bin/kmod", "/sbin/modprobe",
    "/sbin/ldconfig",
])
def test_the_toolchain_is_native_to_each_image(built: ManifestList, path: str) -> None:
    for platform, machine, triplet in (("linux/arm64", "aarch64", "aarch64-linux-gnu"),
                                       ("linux/amd64", "x86-64", "x86_64-linux-gnu")):
        assert machine_of(built.images[platform].rootfs, path.format(triplet=triplet)) == machine


def test_the_venvs_compiled_wheels_are_aarch64(built: ManifestList) -> None:
    """cryptography, cffi, PyYAML: wheels for aarch64 from the wheelhouse, not the builder's."""
    rootfs = built.images["linux/arm64"].rootfs
    site = next((rootfs / "opt/installer/lib").glob("python3*/site-packages"))
    shared = sorted(site.rglob("*.so"))
    names = {path.relative_to(site).parts[0] for path in shared}
    assert {"cryptography", "yaml"} <= names, names
    assert {machine_of(rootfs, "/" + str(p.relative_to(rootfs))) for p in shared} == {"aarch64"}


def test_the_installer_runs_in_the_arm64_root_under_qemu(built: ManifestList) -> None:
    version = in_arm64_root(built, "installer", "--version")
    assert version.returncode == 0, version.stderr
    assert VERSION in version.stdout
    machine = in_arm64_root(built, "/opt/installer/bin/python3", "-c",
                            "import platform, yaml, cryptography.hazmat.bindings._rust; "
                            "print(platform.machine())")
    assert (machine.returncode, machine.stdout) == (0, "aarch64\n"), machine.stderr


def test_installer_plan_of_a_debian_arm64_host_in_the_arm64_image(built: ManifestList) -> None:
    """A Debian 12 arm64 node (4k pages, Debian's arm64 kernel built with gcc-12) posed at /host
    in the arm64 root, as the DaemonSet mounts the node's root: plan names the aarch64 .run and
    finds the kernel's gcc-12 in the image."""
    host = built.images["linux/arm64"].rootfs / "host"
    pose_host(host, "debian-12", KERNEL, "aarch64", PROC_VERSION)
    header_tree(host / f"usr/src/linux-headers-{KERNEL}", KERNEL, 12, 4)
    (host / f"lib/modules/{KERNEL}/build").symlink_to(f"/usr/src/linux-headers-{KERNEL}")
    result = in_arm64_root(built, "installer", "plan", env={
        "ROOT_MOUNT_DIR": "/host", "NVIDIA_INSTALL_DIR_HOST": "/home/kubernetes/bin/nvidia",
        "NVIDIA_INSTALL_DIR_CONTAINER": "/nonexistent", "NVIDIA_KERNEL_RELEASE": KERNEL,
        "NVIDIA_INSTALLER_FETCH_HEADERS": "false", "NVIDIA_DRIVER_VERSION": "580.126.20"})
    assert result.returncode == 0, result.stdout + result.stderr
    plan = result.stdout
    assert re.search(rf"kernel: {KERNEL} +arch: aarch64", plan)
    assert "architecture: aarch64\n" in plan
    assert "NVIDIA's .run for it: NVIDIA-Linux-aarch64-580.126.20.run" in plan
    assert "page-size: 4 KiB\n" in plan
    assert "kernel-flavour: arm64\n" in plan
    assert "compiler: gcc-12\n      because gcc-12 from the image" in plan
    assert not (host / "home/kubernetes/bin/nvidia").exists()  # plan changes nothing
