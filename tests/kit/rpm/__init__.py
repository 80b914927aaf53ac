"""RPMs of the fake driver and a dnf module-stream repository for tests (see builder.py)."""

from __future__ import annotations

from kit.rpm.builder import (
    DEFAULT_SPEC,
    KERNEL,
    KERNEL8,
    KMOD,
    SIGNER,
    SIGNING_KEY,
    V565,
    V570,
    V575,
    V580A,
    V580B,
    Release,
    RepoSpec,
    build_repo,
    modules_yaml,
    nevra,
    precompiled_kmod,
    write_repo_file,
)
from kit.rpm.extras import build_extras, install_base

__all__ = [
    "DEFAULT_SPEC",
    "KERNEL",
    "KERNEL8",
    "KMOD",
    "SIGNER",
    "SIGNING_KEY",
    "V565",
    "V570",
    "V575",
    "V580A",
    "V580B",
    "Release",
    "RepoSpec",
    "build_extras",
    "build_repo",
    "install_base",
    "modules_yaml",
    "nevra",
    "precompiled_kmod",
    "write_repo_file",
]
