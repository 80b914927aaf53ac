"""The host's ld cache: one ld.so.conf.d drop-in for the install dir and `ldconfig -r <root>`."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path, PurePosixPath

from installer.hostroot import HostRoot
from installer.layout import LD_DROP_IN
from installer.runner import Runner

log = logging.getLogger(__name__)

REQUIRED_SONAMES = ("libnvidia-ml.so.1", "libcuda.so.1")
_CACHE_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


def drop_in_text(lib_dir_host: PurePosixPath) -> str:
    return f"{lib_dir_host}\n"


def ldconfig_argv(root: HostRoot, *extra: str) -> list[str]:
    return root.tool_argv("ldconfig", *extra)


def cached_libraries(root: HostRoot, runner: Runner) -> dict[str, list[str]]:
    """soname -> host paths, as the host's /etc/ld.so.cache lists them."""
    result = runner.run(ldconfig_argv(root, "-p"), check=False)
    entries: dict[str, list[str]] = {}
    for line in result.output.splitlines():
        match = _CACHE_LINE.match(line)
        if match:
            entries.setdefault(match.group(1), []).append(match.group(3))
    return entries


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
        root.write_atomic(conf, "".join(kept))
        log.info("removed %d appended %s line(s) from %s", len(lines) - len(kept),
                 lib_dir_host, conf)
