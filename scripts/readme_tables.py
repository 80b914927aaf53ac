"""Prints the tables of docs/settings.md and docs/errors.md from the code (a test checks them)."""

from __future__ import annotations

import sys
from pathlib import Path

from installer.config import SETTINGS
from installer.errors import all_error_types


def settings_table() -> str:
    rows = ["| variable | flag | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = f"`{s.default}`" if s.default else "unset"
        flag = "(environment only)" if s.secret else f"`{s.flag}`"
        rows.append(f"| `{s.env}` | {flag} | {default} | {s.help} |")
    return "\n".join(rows)


def exit_codes_table() -> str:
    rows = ["| exit | reference | what to do |", "|---|---|---|"]
    rows.append("| 0 | | success (also: every step was already satisfied) |")
    rows.append("| 2 | | usage error (unknown flag or command) |")
    for error in all_error_types():
        hint = error.default_hint or "unexpected error: the traceback is printed"
        reference = f"`{error.reference}`" if error.exit_code != 1 else ""
        rows.append(f"| {error.exit_code} | {reference} | {hint} |")
    return "\n".join(rows)


def rewrite(doc: Path, table: str) -> None:
    """Replace the table in `doc` that starts with `table`'s header row by `table`."""
    lines = doc.read_text().split("\n")
    start = lines.index(table.split("\n", 1)[0])
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    doc.write_text("\n".join([*lines[:start], table, *lines[end:]]))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:  # after adding a setting or an error
        docs = Path(__file__).resolve().parents[1] / "docs"
        rewrite(docs / "settings.md", settings_table())
        rewrite(docs / "errors.md", exit_codes_table())
    else:
        print(settings_table())
        print()
        print(exit_codes_table())
