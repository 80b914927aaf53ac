"""RPMs of the fake driver and a dnf module-stream repository for tests (see builder.py)."""

from __future__ import annotations

from kit.rpm.builder import (
    DEFAULT_SPEC,
    KERNEL,
    KMOD,
    V570,
    V575,
    V580A,
    V580B,
    Release,
    RepoSpec,
    build_repo,
    modules_yaml,
    nevra,
    write_repo_file,
)

__all__ = [
    "DEFAULT_SPEC",
    "KERNEL",
    "KMOD",
    "V570",
    "V575",
    "V580A",
    "V580B",
    "Release",
    "RepoSpec",
    "build_repo",
    "modules_yaml",
    "nevra",
    "write_repo_file",
]
