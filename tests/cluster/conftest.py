"""Fixtures the cluster tests share."""

from __future__ import annotations

import pytest

from installer.components import registry


@pytest.fixture
def driver_readiness_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's part of readiness alone (the components are another test's subject): no
    component is registered. A module asks for it with pytest.mark.usefixtures."""
    monkeypatch.setattr(registry, "COMPONENTS", ())
