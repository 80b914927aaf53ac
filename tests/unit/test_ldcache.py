"""The ld cache probe reads the host's /etc/ld.so.cache itself (a warm run spawns no
ldconfig) and asks `ldconfig -p` only about a file it does not know. The real ldconfig's files,
in each of its formats: tests/integration/test_ld_cache_file.py."""

from __future__ import annotations

import os
import struct
from pathlib import Path, PurePosixPath

import pytest
from lib.fakes import FakeRunner
from lib.hosttrees import host_root

from installer.steps import ldcache

LIB_DIR_HOST = PurePosixPath("/home/kubernetes/bin/nvidia/lib64")
VERSION = "580.105.08"


def new_format_cache(entries: list[tuple[str, str]]) -> bytes:
    """An ld.so.cache in glibc's "new" format (dl-cache.h): a 48-byte header, 24-byte entries
    (flags, key, value, unused, hwcaps), then the strings, offsets from the file's start."""
    strings = b""
    offsets = []
    base = 48 + 24 * len(entries)
    for soname, path in entries:
        key = base + len(strings)
        strings += soname.encode() + b"\0"
        value = base + len(strings)
        strings += path.encode() + b"\0"
        offsets.append((key, value))
    header = b"glibc-ld.so.cache1.1" + struct.pack("=IIB3xI12x", len(entries), len(strings), 2, 0)
    body = b"".join(struct.pack("=iIIIQ", 0x0303, key, value, 0, 0) for key, value in offsets)
    return header + body + strings


def installed(tmp_path: Path, cache: bytes | None) -> Path:
    """The drop-in and the soname links of VERSION under the root; `cache` as its ld.so.cache."""
    lib_dir = tmp_path / LIB_DIR_HOST.relative_to("/")
    lib_dir.mkdir(parents=True)
    for soname in ldcache.REQUIRED_SONAMES:
        os.symlink(f"{soname.rsplit('.so', 1)[0]}.so.{VERSION}", lib_dir / soname)
    drop_in = tmp_path / "etc/ld.so.conf.d/nvidia-driver-installer.conf"
    drop_in.parent.mkdir(parents=True)
    drop_in.write_text(ldcache.drop_in_text(LIB_DIR_HOST))
    if cache is not None:
        (tmp_path / "etc/ld.so.cache").write_bytes(cache)
    return lib_dir


def listed(lib_dir_host: PurePosixPath) -> list[tuple[str, str]]:
    return [("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6")] + [
        (soname, str(lib_dir_host / soname)) for soname in ldcache.REQUIRED_SONAMES]


def test_the_cache_file_is_read_without_running_ldconfig(tmp_path: Path) -> None:
    lib_dir = installed(tmp_path, new_format_cache(listed(LIB_DIR_HOST)))
    runner = FakeRunner()  # answers nothing: a command would fail the test
    assert ldcache.is_configured(host_root(tmp_path), runner, LIB_DIR_HOST, lib_dir, VERSION)
    assert runner.argvs() == []


def test_a_cache_without_our_libraries_is_not_configured(tmp_path: Path) -> None:
    other = PurePosixPath("/opt/other/lib64")
    lib_dir = installed(tmp_path, new_format_cache(listed(other)))
    runner = FakeRunner()
    assert not ldcache.is_configured(host_root(tmp_path), runner, LIB_DIR_HOST, lib_dir, VERSION)
    assert runner.argvs() == []


@pytest.mark.parametrize("cache", [None, b"", b"not a cache at all",
                                   new_format_cache(listed(LIB_DIR_HOST))[:60]],
                         ids=["missing", "empty", "unknown", "cut-short"])
def test_a_cache_file_it_cannot_read_is_left_to_ldconfig(tmp_path: Path,
                                                         cache: bytes | None) -> None:
    lib_dir = installed(tmp_path, cache)
    printed = "".join(f"\t{soname} (libc6,x86-64) => {path}\n"
                      for soname, path in listed(LIB_DIR_HOST))
    runner = FakeRunner().on("ldconfig", output=f"4 libs found in cache `/etc/ld.so.cache'\n"
                                                f"{printed}")
    assert ldcache.is_configured(host_root(tmp_path), runner, LIB_DIR_HOST, lib_dir, VERSION)
    assert runner.argvs() == [["ldconfig", "-r", str(tmp_path), "-p"]]
