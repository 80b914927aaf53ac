"""The installer's command line run in-process, with only the environment a test gives it."""

from __future__ import annotations

import os

import pytest

from installer import cli


def invoke(monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str]) -> int:
    """Exit code of `installer ARGS`; the caller's NVIDIA_* and ROOT_MOUNT_DIR settings are
    removed first so that a developer's shell cannot change what a test sees."""
    for key in list(os.environ):
        if key.startswith(("NVIDIA_", "ROOT_MOUNT_DIR")):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    return int(info.value.code or 0)
