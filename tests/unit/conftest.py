"""Unit tests run no processes: any subprocess is a failure (use a fake Runner). Nor do they read
the test machine's own kernel header trees: the installer's image is posed, empty unless a test
puts headers into it (`image_root`)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def subprocess_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"unexpected subprocess in a unit test: {args[0] if args else ''}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    yield


@pytest.fixture(autouse=True)
def image_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The installer image's root for header lookups: whatever /usr/src the test machine has
    (Debian's linux-headers-amd64 moves to a new ABI every few weeks) is never seen."""
    from installer.headers import trees

    root = tmp_path_factory.mktemp("image-root")
    monkeypatch.setattr(trees, "IMAGE_ROOT", root)
    return root
