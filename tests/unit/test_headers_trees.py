"""Header trees as nvidia-installer needs them: the source path (include/linux/kernel.h) and the
output path (the configured tree) for every layout."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from installer.headers import trees
from installer.headers.steps import path_decisions
from installer.hostroot import HostRoot
from installer.plan import Headers

K = "6.1.0-56-amd64"
COMMON = "/usr/src/linux-headers-6.1.0-56-common"
UBUNTU_K = "5.15.0-105-generic"
RHEL_K = "5.14.0-427.13.1.el9_4.x86_64"
VERSION_H = "include/generated/uapi/linux/version.h"
KERNEL_H = "include/linux/kernel.h"


def touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def debian_split_headers(root: Path, *, source_link: bool = True, common: bool = True) -> None:
    """Debian's two packages: the -amd64 output tree (generated headers, its Makefile includes
    -common's by absolute path) and the -common source tree; /lib/modules links to both."""
    arch = root / f"usr/src/linux-headers-{K}"
    touch(arch / "Makefile", f"include {COMMON}/Makefile\n")
    touch(arch / VERSION_H, "#define LINUX_VERSION_CODE 393473\n")
    (root / "usr/lib/linux-kbuild-6.1/scripts").mkdir(parents=True)
    os.symlink("../../lib/linux-kbuild-6.1/scripts", arch / "scripts")
    if common:
        touch(root / COMMON.lstrip("/") / "Makefile", "VERSION = 6\n")
        touch(root / COMMON.lstrip("/") / KERNEL_H)
    (root / f"lib/modules/{K}").mkdir(parents=True)
    os.symlink(f"/usr/src/linux-headers-{K}", root / f"lib/modules/{K}/build")
    if source_link:
        os.symlink(COMMON, root / f"lib/modules/{K}/source")


def test_debian_split_headers_give_common_as_source_and_amd64_as_output(tmp_path: Path) -> None:
    debian_split_headers(tmp_path)
    found = trees.find_headers(HostRoot(tmp_path), K)
    assert found is not None
    assert found.output_path == PurePosixPath(f"/usr/src/linux-headers-{K}")
    assert found.source_path == PurePosixPath(COMMON)
    assert found.binds == (PurePosixPath("/usr/lib/linux-kbuild-6.1"), PurePosixPath("/usr/src"))
    assert f"/lib/modules/{K}/source" in found.source_why and KERNEL_H in found.source_why
    assert f"/lib/modules/{K}/build" in found.output_why and VERSION_H in found.output_why


def test_debian_source_is_found_through_the_makefile_without_the_source_link(
    tmp_path: Path,
) -> None:
    debian_split_headers(tmp_path, source_link=False)
    found = trees.find_headers(HostRoot(tmp_path), K)
    assert found is not None and found.source_path == PurePosixPath(COMMON)
    assert f"/usr/src/linux-headers-{K}/Makefile includes" in found.source_why


def test_an_output_tree_without_its_source_tree_is_no_headers(tmp_path: Path) -> None:
    """-amd64 alone fails nvidia-installer's kernel.h check: look elsewhere (cache, fetch)."""
    debian_split_headers(tmp_path, common=False)
    assert trees.find_headers(HostRoot(tmp_path), K) is None


def test_an_unconfigured_tree_is_no_headers(tmp_path: Path) -> None:
    tree = tmp_path / f"usr/src/kernels/{RHEL_K}"
    touch(tree / "Makefile")
    touch(tree / KERNEL_H)
    assert trees.find_headers(HostRoot(tmp_path), RHEL_K) is None


def test_ubuntu_flavour_tree_is_both_paths(tmp_path: Path) -> None:
    base = tmp_path / "usr/src/linux-headers-5.15.0-105"
    touch(base / KERNEL_H)
    touch(base / "Makefile")
    flavour = tmp_path / f"usr/src/linux-headers-{UBUNTU_K}"
    touch(flavour / VERSION_H)
    os.symlink("../linux-headers-5.15.0-105/Makefile", flavour / "Makefile")
    os.symlink("../../linux-headers-5.15.0-105/include/linux", flavour / "include/linux")
    (tmp_path / f"lib/modules/{UBUNTU_K}").mkdir(parents=True)
    os.symlink(f"/usr/src/linux-headers-{UBUNTU_K}", tmp_path / f"lib/modules/{UBUNTU_K}/build")
    found = trees.find_headers(HostRoot(tmp_path), UBUNTU_K)
    assert found is not None
    assert found.source_path == found.output_path == PurePosixPath(
        f"/usr/src/linux-headers-{UBUNTU_K}")
    assert found.source_why == f"the same tree (it has {KERNEL_H})"


@pytest.mark.parametrize("build_link", [True, False])
def test_rhel_kernel_devel_is_one_tree(tmp_path: Path, build_link: bool) -> None:
    tree = tmp_path / f"usr/src/kernels/{RHEL_K}"
    touch(tree / "Makefile")
    touch(tree / KERNEL_H)
    touch(tree / VERSION_H)
    if build_link:
        (tmp_path / f"lib/modules/{RHEL_K}").mkdir(parents=True)
        os.symlink(f"/usr/src/kernels/{RHEL_K}", tmp_path / f"lib/modules/{RHEL_K}/build")
    found = trees.find_headers(HostRoot(tmp_path), RHEL_K)
    assert found is not None
    assert found.source_path == found.output_path == PurePosixPath(f"/usr/src/kernels/{RHEL_K}")
    assert found.binds == (PurePosixPath("/usr/src"),)


def test_gke_build_dir_in_lib_modules_is_both_paths_and_is_bound(tmp_path: Path) -> None:
    tree = tmp_path / f"lib/modules/{K}/build"
    touch(tree / "Makefile")
    touch(tree / KERNEL_H)
    touch(tree / "include/linux/version.h")
    found = trees.find_headers(HostRoot(tmp_path), K)
    assert found is not None
    assert found.source_path == found.output_path == PurePosixPath(f"/lib/modules/{K}/build")
    assert found.binds == (PurePosixPath(f"/lib/modules/{K}"), PurePosixPath("/usr/src"))


def test_no_headers_is_none(tmp_path: Path) -> None:
    assert trees.find_headers(HostRoot(tmp_path), K) is None


def test_build_runs_with_the_host_trees_at_their_own_paths(tmp_path: Path) -> None:
    debian_split_headers(tmp_path)
    root = HostRoot(tmp_path)
    headers = trees.find_headers(root, K)
    assert headers is not None
    argv = trees.with_host_trees(root, headers, ["nvidia-installer", "--silent"])
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    script = argv[7]
    assert 'mount --bind "${1}" "${2}"' in script and 'mount --bind "${3}" "${4}"' in script
    assert argv[9:] == [str(tmp_path / "usr/lib/linux-kbuild-6.1"), "/usr/lib/linux-kbuild-6.1",
                        str(tmp_path / "usr/src"), "/usr/src", "nvidia-installer", "--silent"]


def test_a_bare_host_needs_no_namespace() -> None:
    headers = Headers(PurePosixPath("/usr/src/x"), PurePosixPath("/usr/src/x"),
                             (PurePosixPath("/usr/src"),))
    assert trees.with_host_trees(HostRoot(Path("/")), headers, ["a"]) == ["a"]


def test_missing_headers_name_the_package_the_kernel_and_the_sources_tried() -> None:
    error = trees.missing_headers_error(K, "debian", tried="tried the host's package sources "
                                         "(/etc/apt/sources.list)")
    assert error.reference == "kernel-headers-missing"
    assert f"no kernel headers for kernel {K}" in error.message
    assert f"linux-headers-{K}: tried the host's package sources (/etc/apt/sources.list)" in (
        error.message)
    assert f"/usr/src/linux-headers-{K}" in error.message
    assert f"linux-headers-{K}" in error.hint


def test_headers_unpacked_into_the_cache_keep_debians_split(tmp_path: Path) -> None:
    """Packages unpacked into the cache carry Debian's absolute /lib/modules links: they are
    followed inside the unpacked root, and the trees are bound from there."""
    debian_split_headers(tmp_path / "cache")
    found = trees.find_unpacked_headers(tmp_path / "cache", K)
    assert found is not None and found.unpacked_root == tmp_path / "cache"
    assert (found.source_path, found.output_path) == (
        PurePosixPath(COMMON), PurePosixPath(f"/usr/src/linux-headers-{K}"))
    argv = trees.with_host_trees(HostRoot(Path("/")), found, ["make"])
    assert argv[9:] == [str(tmp_path / "cache/usr/lib/linux-kbuild-6.1"),
                        "/usr/lib/linux-kbuild-6.1", str(tmp_path / "cache/usr/src"), "/usr/src",
                        "make"]


def test_plan_names_both_paths_and_why(tmp_path: Path) -> None:
    debian_split_headers(tmp_path)
    found = trees.find_headers(HostRoot(tmp_path), K)
    source, output = path_decisions(found)
    assert (source.topic, source.value) == ("kernel-source-path", COMMON)
    assert (output.topic, output.value) == ("kernel-output-path", f"/usr/src/linux-headers-{K}")
    assert "Debian's split headers" in source.reason and VERSION_H in output.reason
    (fetched,) = path_decisions(None)
    assert fetched.topic == "kernel-source-path" and "-common" in fetched.reason


def test_rhel_headers_package_is_kernel_devel() -> None:
    assert trees.headers_package("rhel", "5.14.0-427.el9.x86_64") == (
        "kernel-devel-5.14.0-427.el9.x86_64")
