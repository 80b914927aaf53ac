"""Prints the tables of docs/settings.md and docs/errors.md from the code (a test checks them)."""

from __future__ import annotations

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


if __name__ == "__main__":
    print(settings_table())
    print()
    print(exit_codes_table())
