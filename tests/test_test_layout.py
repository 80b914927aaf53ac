"""The test tree's layout: a helper two tiers share lives in tests/lib, so no tier imports
another tier's folder. tests/kit (the fake-driver kit every tier installs) is shared by design:
it imports no tier, and every tier may import it."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Folders every tier may import: the shared helpers and the fake-driver kit.
SHARED = {"lib", "kit"}
# None left: a crossing found is a helper to move into tests/lib.
KNOWN_CROSSINGS: set[tuple[str, str]] = set()


def tiers() -> set[str]:
    return {path.parent.name for path in TESTS.glob("*/__init__.py")} | {
        path.parent.name for path in TESTS.glob("*/conftest.py")} | {
        path.parent.name for path in TESTS.glob("*/test_*.py")}


def top_level_imports(tree: ast.AST) -> set[str]:
    """The first name of every absolute import, at any depth of the file (functions included)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def crossings() -> set[tuple[str, str]]:
    """(file under tests/, the other tier it imports) for every import of another tier."""
    known = tiers() | SHARED
    found: set[tuple[str, str]] = set()
    for path in sorted(TESTS.glob("*/**/*.py")):
        own = path.relative_to(TESTS).parts[0]
        tree = ast.parse(path.read_text(), str(path))
        for name in top_level_imports(tree) & known:
            if name != own and name not in SHARED:
                found.add((path.relative_to(TESTS).as_posix(), name))
    return found


def test_the_tiers_are_found() -> None:
    assert {"unit", "integration", "vm", "pod", "deploy", "cluster"} <= tiers()
    assert not SHARED & {"unit", "integration", "vm", "pod", "deploy", "cluster"}


def test_no_tier_imports_another_tiers_folder() -> None:
    assert crossings() - KNOWN_CROSSINGS == set()


def test_the_known_crossings_are_still_there() -> None:
    """A crossing that is gone leaves the list, so the list cannot hide a new one."""
    assert KNOWN_CROSSINGS - crossings() == set()


def test_the_shared_folders_import_no_tier() -> None:
    for folder in SHARED:
        for path in sorted((TESTS / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            assert not top_level_imports(tree) & (tiers() - SHARED), path


def test_a_crossing_is_found() -> None:
    tree = ast.parse("def f():\n    from vm.initramfs import BOOT_MODULES\nimport pod.spec\n")
    assert {"vm", "pod"} <= top_level_imports(tree)
