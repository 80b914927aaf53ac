from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeRunner

from installer import compiler


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
    assert compiler.kernel_gcc_major(text) == major



def test_gcc_major_from_the_headers_config(tmp_path: Path) -> None:
    (tmp_path / "include/config").mkdir(parents=True)
    (tmp_path / "include/config/auto.conf").write_text(
        'CONFIG_CC_VERSION_TEXT="gcc-12 (Debian 12.2.0-14) 12.2.0"\nCONFIG_GCC_VERSION=120200\n')
    assert compiler.headers_gcc_major(tmp_path) == 12
    assert compiler.headers_gcc_major(tmp_path / "absent") is None


def test_versioned_gcc_of_the_kernel_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler.shutil, "which", lambda name: f"/usr/bin/{name}")
    chosen = compiler.choose(FakeRunner().on("gcc", output="12\n"), 11)
    assert chosen is not None and chosen.env == {"CC": "gcc-11"}


def test_default_gcc_of_the_same_major_needs_no_cc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler.shutil, "which",
                        lambda name: "/usr/bin/gcc" if name == "gcc" else None)
    chosen = compiler.choose(FakeRunner().on("gcc", "-dumpversion", output="12\n"), 12)
    assert chosen is not None and chosen.env == {}


@pytest.mark.parametrize(("major", "tags"), [
    (9, "ubuntu20.04"), (10, "ubuntu20.04"), (11, "ubuntu22.04 or rocky9"),
    (12, "debian12 or ubuntu22.04 or ubuntu24.04"), (13, "ubuntu24.04"), (14, "ubuntu24.04"),
    (8, "rocky8"),
])
def test_no_matching_gcc_names_the_compiler_and_the_tag(monkeypatch: pytest.MonkeyPatch,
                                                         major: int, tags: str) -> None:
    monkeypatch.setattr(compiler.shutil, "which",
                        lambda name: "/usr/bin/gcc" if name == "gcc" else None)
    runner = FakeRunner().on("gcc", "-dumpversion", output="15\n")
    assert compiler.choose(runner, major) is None
    error = compiler.missing_error("5.4.0-200-generic", major, "/proc/version", runner)
    assert error.reference == "compiler-missing" and error.exit_code == 43
    assert f"built with gcc {major} (/proc/version)" in error.message
    assert "this image has gcc 15 and no gcc-" in error.message
    assert error.hint == f"Compiler gcc-{major}: use the installer image tag {tags}, which " \
        f"carries gcc-{major}."
