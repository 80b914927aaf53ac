"""The README's tables are generated from the code; this keeps them true."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import readme_tables  # noqa: E402


def test_settings_table_matches_the_code() -> None:
    assert readme_tables.settings_table() in (ROOT / "README.md").read_text()


def test_exit_codes_table_matches_the_code() -> None:
    assert readme_tables.exit_codes_table() in (ROOT / "README.md").read_text()


def test_readme_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```sh", 1)[1].split("```", 1)[0]
    assert "scripts/demo" in first_block and ".ci/run" in first_block
    assert (ROOT / "scripts/demo").exists() and (ROOT / ".ci/run").exists()
