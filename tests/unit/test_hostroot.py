from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from installer.hostroot import HostRoot, write_atomic


def test_absolute_symlinks_resolve_inside_the_root(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    (tmp_path / "usr/src/linux-headers-6.1").mkdir(parents=True)
    (tmp_path / "lib/modules/6.1").mkdir(parents=True)
    os.symlink("/usr/src/linux-headers-6.1", tmp_path / "lib/modules/6.1/build")
    assert root.resolve("/lib/modules/6.1/build") == PurePosixPath("/usr/src/linux-headers-6.1")
    assert root.local_resolved("/lib/modules/6.1/build") == tmp_path / "usr/src/linux-headers-6.1"


def test_relative_links_and_dotdot_stay_inside(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    (tmp_path / "usr/lib/kbuild/scripts").mkdir(parents=True)
    (tmp_path / "usr/src/h").mkdir(parents=True)
    os.symlink("../../lib/kbuild/scripts", tmp_path / "usr/src/h/scripts")
    os.symlink("../../../../../../etc", tmp_path / "usr/src/escape")
    assert root.resolve("/usr/src/h/scripts") == PurePosixPath("/usr/lib/kbuild/scripts")
    assert root.resolve("/usr/src/escape") == PurePosixPath("/etc")


def test_symlink_loops_are_an_error(tmp_path: Path) -> None:
    os.symlink("/b", tmp_path / "a")
    os.symlink("/a", tmp_path / "b")
    with pytest.raises(Exception, match="too many levels"):
        HostRoot(tmp_path).resolve("/a")


def test_local_refuses_relative_and_dotdot(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    with pytest.raises(ValueError):
        root.local("etc/passwd")
    with pytest.raises(ValueError):
        root.local("/etc/../../x")


def test_host_path_is_the_inverse_of_local(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    assert root.host_path(root.local("/var/lib/nvidia")) == PurePosixPath("/var/lib/nvidia")


def test_write_atomic_replaces_and_sets_mode(tmp_path: Path) -> None:
    target = tmp_path / "etc/ld.so.conf.d/x.conf"
    write_atomic(target, "one\n")
    write_atomic(target, "two\n", mode=0o600)
    assert target.read_text() == "two\n"
    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["x.conf"]


def test_tools_run_as_they_are_on_a_bare_host() -> None:
    bare = HostRoot(Path("/"))
    for tool in ("ldconfig", "depmod", "modprobe", "rpm", "dnf", "dkms"):
        assert bare.tool_argv(tool, "x") == [tool, "x"]


def test_each_tool_gets_its_own_root_flag_or_chroot(tmp_path: Path) -> None:
    root, r = HostRoot(tmp_path), str(tmp_path)
    assert root.tool_argv("ldconfig", "-p") == ["ldconfig", "-r", r, "-p"]
    assert root.tool_argv("depmod", "6.1.0-26-amd64") == ["depmod", "-b", r, "6.1.0-26-amd64"]
    assert root.tool_argv("modprobe", "nvidia") == ["modprobe", "-d", r, "nvidia"]
    assert root.tool_argv("rpm", "-q", "dkms") == ["rpm", "--root", r, "-q", "dkms"]
    assert root.tool_argv("dnf", "makecache") == ["dnf", f"--installroot={r}", "makecache"]
    assert root.tool_argv("dkms", "status") == ["chroot", r, "dkms", "status"]


def test_a_tool_without_a_known_way_into_the_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        HostRoot(tmp_path).tool_argv("apt-get", "update")
