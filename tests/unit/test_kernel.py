from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from installer import kernel
from installer.hostroot import HostRoot

K = "6.1.0-56-amd64"


def debian_like_headers(root: Path) -> None:
    arch = root / f"usr/src/linux-headers-{K}"
    (arch / "include").mkdir(parents=True)
    (arch / "Makefile").write_text(f"include /usr/src/linux-headers-{K[:-6]}-common/Makefile\n")
    (root / "usr/lib/linux-kbuild-6.1/scripts").mkdir(parents=True)
    os.symlink("../../lib/linux-kbuild-6.1/scripts", arch / "scripts")
    (root / f"lib/modules/{K}").mkdir(parents=True)
    os.symlink(f"/usr/src/linux-headers-{K}", root / f"lib/modules/{K}/build")


def test_headers_found_through_the_absolute_build_link(tmp_path: Path) -> None:
    debian_like_headers(tmp_path)
    found = kernel.find_headers(HostRoot(tmp_path), K)
    assert found is not None
    assert found.host_path == PurePosixPath(f"/usr/src/linux-headers-{K}")
    assert found.binds == (PurePosixPath("/usr/lib/linux-kbuild-6.1"), PurePosixPath("/usr/src"))


def test_no_headers_is_none(tmp_path: Path) -> None:
    assert kernel.find_headers(HostRoot(tmp_path), K) is None


def test_build_runs_with_the_host_trees_at_their_own_paths(tmp_path: Path) -> None:
    debian_like_headers(tmp_path)
    root = HostRoot(tmp_path)
    headers = kernel.find_headers(root, K)
    assert headers is not None
    argv = kernel.with_host_trees(root, headers, ["nvidia-installer", "--silent"])
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    script = argv[7]
    assert 'mount --bind "${1}" "${2}"' in script and 'mount --bind "${3}" "${4}"' in script
    assert argv[9:] == [str(tmp_path / "usr/lib/linux-kbuild-6.1"), "/usr/lib/linux-kbuild-6.1",
                        str(tmp_path / "usr/src"), "/usr/src", "nvidia-installer", "--silent"]


def test_a_bare_host_needs_no_namespace(tmp_path: Path) -> None:
    headers = kernel.Headers(PurePosixPath("/usr/src/x"), (PurePosixPath("/usr/src"),))
    assert kernel.with_host_trees(HostRoot(Path("/")), headers, ["a"]) == ["a"]


def test_missing_headers_name_the_package_the_kernel_and_the_sources_tried() -> None:
    error = kernel.missing_headers_error(K, "debian", tried="tried the host's package sources "
                                         "(/etc/apt/sources.list)")
    assert error.reference == "kernel-headers-missing"
    assert f"no kernel headers for kernel {K}" in error.message
    assert f"linux-headers-{K}: tried the host's package sources (/etc/apt/sources.list)" in (
        error.message)
    assert f"/usr/src/linux-headers-{K}" in error.message
    assert f"linux-headers-{K}" in error.hint


def test_unpacked_headers_bind_their_own_trees(tmp_path: Path) -> None:
    debian_like_headers(tmp_path / "cache")
    found = kernel.find_unpacked_headers(tmp_path / "cache", K)
    assert found is not None and found.unpacked_root == tmp_path / "cache"
    argv = kernel.with_host_trees(HostRoot(Path("/")), found, ["make"])
    assert argv[9:] == [str(tmp_path / "cache/usr/lib/linux-kbuild-6.1"),
                        "/usr/lib/linux-kbuild-6.1", str(tmp_path / "cache/usr/src"), "/usr/src",
                        "make"]


def test_rhel_headers_package_is_kernel_devel() -> None:
    assert kernel.headers_package("rhel", "5.14.0-427.el9.x86_64") == (
        "kernel-devel-5.14.0-427.el9.x86_64")
