"""The base of every known failure, and the list of them all."""

from __future__ import annotations


class InstallerError(Exception):
    """A failure the operator can act on.

    `reference` is a stable kebab-case name (logs, termination message, README);
    `exit_code` is distinct per reference; `hint` says what to do about it.
    """

    reference = "installer-error"
    exit_code = 1
    default_hint = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint


def all_error_types() -> list[type[InstallerError]]:
    """Every error class, for the exit-code table (docs/errors.md) and the uniqueness test."""
    found: list[type[InstallerError]] = []
    pending: list[type[InstallerError]] = [InstallerError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.exit_code)
