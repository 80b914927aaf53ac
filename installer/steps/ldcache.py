"""The host's ld cache: one ld.so.conf.d drop-in for the install dir, `ldconfig -r <root>`, and
the cache file read as the dynamic loader reads it."""

from __future__ import annotations

import logging
import os
import re
import struct
from pathlib import Path, PurePosixPath

from installer.hostroot import HostRoot
from installer.layout import LD_DROP_IN
from installer.runner import Runner

log = logging.getLogger(__name__)

REQUIRED_SONAMES = ("libnvidia-ml.so.1", "libcuda.so.1")
CACHE_FILE = "/etc/ld.so.cache"
_CACHE_LINE = r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$"
# glibc's ld.so.cache: magic, then the entry count (old: at 12; new: right after the magic and
# version), the entries (old: flags, key, value; new: those, an unused word and the hwcaps),
# then the NUL-terminated strings their key (soname) and value (path) point into.
_OLD_MAGIC = b"ld.so-1.7.0"
_OLD_HEADER, _OLD_ENTRY = 16, 12
_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_NEW_HEADER, _NEW_ENTRY = 48, 24


def drop_in_text(lib_dir_host: PurePosixPath) -> str:
    return f"{lib_dir_host}\n"


def ldconfig_argv(root: HostRoot, *extra: str) -> list[str]:
    return root.tool_argv("ldconfig", *extra)


def cached_libraries(root: HostRoot, runner: Runner) -> dict[str, list[str]]:
    """soname -> host paths, as the host's /etc/ld.so.cache lists them: read from the file as
    the dynamic loader reads it or, for a file this does not know, as `ldconfig -p` prints it
    (a warm run spawns no ldconfig)."""
    try:
        pairs = read_cache(root.local_resolved(CACHE_FILE).read_bytes())
    except OSError:
        pairs = None
    if pairs is None:
        pairs = []
        for line in runner.run(ldconfig_argv(root, "-p"), check=False).output.splitlines():
            match = re.match(_CACHE_LINE, line)
            if match:
                pairs.append((match.group(1), match.group(3)))
    entries: dict[str, list[str]] = {}
    for soname, path in pairs:
        entries.setdefault(soname, []).append(path)
    return entries


def read_cache(data: bytes) -> list[tuple[str, str]] | None:
    """(soname, path) of each entry of an ld.so.cache in glibc's formats (sysdeps/generic/
    dl-cache.h), in the order `ldconfig -p` prints them; None for anything else. The "new"
    format alone (glibc 2.32 on), or the "old" one, which the "compat" format follows with the
    new one; the new entries' strings then count from the old string table, as glibc reads
    them."""
    try:
        if data.startswith(_NEW_MAGIC):
            (count,) = struct.unpack_from("=I", data, len(_NEW_MAGIC))
            strings, entries, size = 0, _NEW_HEADER, _NEW_ENTRY
        elif data.startswith(_OLD_MAGIC):
            (count,) = struct.unpack_from("=I", data, _OLD_HEADER - 4)
            strings = _OLD_HEADER + count * _OLD_ENTRY
            entries, size = _OLD_HEADER, _OLD_ENTRY
            new = (strings + 7) & ~7  # "compat": the new format follows, 8-byte aligned
            if data.startswith(_NEW_MAGIC, new):
                (count,) = struct.unpack_from("=I", data, new + len(_NEW_MAGIC))
                entries, size = new + _NEW_HEADER, _NEW_ENTRY
        else:
            return None
        pairs = []
        for index in range(count):
            _, key, value = struct.unpack_from("=iII", data, entries + index * size)
            pairs.append((_string(data, strings + key), _string(data, strings + value)))
        return pairs
    except (struct.error, ValueError):  # cut short or corrupt: ldconfig says what it is
        return None


def _string(data: bytes, start: int) -> str:
    return data[start:data.index(b"\0", start)].decode(errors="replace")


def is_configured(root: HostRoot, runner: Runner, lib_dir_host: PurePosixPath, lib_dir: Path,
                  version: str) -> bool:
    """Drop-in in place, soname links point at `version`, and the host cache lists them."""
    if root.read_text(LD_DROP_IN) != drop_in_text(lib_dir_host):
        return False
    for soname in REQUIRED_SONAMES:
        link = lib_dir / soname
        if not link.is_symlink() or not os.readlink(link).endswith(f".so.{version}"):
            return False
    cached = cached_libraries(root, runner)
    return all(
        str(lib_dir_host / soname) in cached.get(soname, []) for soname in REQUIRED_SONAMES
    )


def configure(root: HostRoot, runner: Runner, lib_dir_host: PurePosixPath) -> None:
    """Write the drop-in (once), drop GKE's appended ld.so.conf lines, rebuild the host cache."""
    if root.read_text(LD_DROP_IN) != drop_in_text(lib_dir_host):
        root.write_atomic(LD_DROP_IN, drop_in_text(lib_dir_host))
        log.info("wrote %s", LD_DROP_IN)
    _remove_appended_lines(root, lib_dir_host)
    runner.run(ldconfig_argv(root), timeout=120)


def remove(root: HostRoot, runner: Runner) -> None:
    """Remove the drop-in and rebuild the host cache without the install dir."""
    path = root.local_resolved(LD_DROP_IN)
    if path.exists():
        path.unlink()
        runner.run(ldconfig_argv(root), timeout=120)


def _remove_appended_lines(root: HostRoot, lib_dir_host: PurePosixPath) -> None:
    """GKE's entrypoint appends the lib dir to /etc/ld.so.conf on every run; the drop-in
    replaces those lines."""
    conf = PurePosixPath("/etc/ld.so.conf")
    text = root.read_text(conf)
    if text is None:
        return
    lines = text.splitlines(keepends=True)
    kept = [line for line in lines if line.strip() != str(lib_dir_host)]
    if len(kept) != len(lines):
        # The host's own file: a link there is the host's choice, so its target is rewritten.
        root.write_atomic(root.resolve(conf), "".join(kept))
        log.info("removed %d appended %s line(s) from %s", len(lines) - len(kept),
                 lib_dir_host, conf)
