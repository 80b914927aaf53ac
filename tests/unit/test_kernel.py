from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest
from fakes import FakeRunner

from installer import kernel
from installer.errors import KernelHeadersMissing
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


@pytest.mark.parametrize(("text", "major"), [
    ("Linux version 6.1.0-56-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian "
     "12.2.0-14+deb12u1) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP", 12),
    ("Linux version 5.15.0-105-generic (buildd@lcy02-amd64-007) (gcc (Ubuntu "
     "11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #115-Ubuntu", 11),
    ("Linux version 5.14.0-427.13.1.el9_4.x86_64 (mockbuild@iad1-prod-build001.bld.equ.rockylinux"
     ".org) (gcc (GCC) 11.4.1 20231218 (Red Hat 11.4.1-3), GNU ld version 2.35.2-43.el9) #1", 11),
    (None, None),
])
def test_kernel_gcc_from_proc_version(text: str | None, major: int | None) -> None:
    assert kernel.kernel_gcc_major(text) == major


def test_compiler_mismatch_is_a_warning_naming_both(caplog: pytest.LogCaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel.shutil, "which", lambda name: None)
    env, note = kernel.matching_compiler(FakeRunner().on("gcc", output="12\n"), 13)
    assert env == {}
    assert "differs from the kernel's gcc 13" in note
    assert "gcc 13" in caplog.text and "gcc 12" in caplog.text


def test_matching_versioned_gcc_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel.shutil, "which", lambda name: f"/usr/bin/{name}")
    env, _ = kernel.matching_compiler(FakeRunner().on("gcc", output="12\n"), 11)
    assert env == {"CC": "gcc-11"}


def test_missing_headers_package_names_package_and_kernel() -> None:
    runner = FakeRunner().on("apt-get", "update").on(
        "apt-get", "install", returncode=100,
        output=f"E: Unable to locate package linux-headers-{K}")
    with pytest.raises(KernelHeadersMissing) as info:
        kernel.install_headers(runner, "apt", "debian", K)
    assert runner.argvs()[-1] == ["apt-get", "install", "-y", "--no-install-recommends",
                                  f"linux-headers-{K}"]
    assert f"no kernel headers for kernel {K}" in info.value.message
    assert "Unable to locate package" in info.value.message
    assert f"linux-headers-{K}" in info.value.hint


def test_rhel_headers_package_is_kernel_devel() -> None:
    assert kernel.headers_package("rhel", "5.14.0-427.el9.x86_64") == (
        "kernel-devel-5.14.0-427.el9.x86_64")
