"""The `reg` fixture: one real OCI registry on 127.0.0.1 for a test file's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lib.registrykit import Registry


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    server = Registry(tmp_path_factory.mktemp("registry")).start()
    yield server
    server.stop()
