"""Unit tests run no processes: any subprocess is a failure (use a fake Runner)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def subprocess_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"unexpected subprocess in a unit test: {args[0] if args else ''}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    yield
