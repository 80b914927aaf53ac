"""Commands the installer runs (runner.py): a failure or a missing tool."""

from __future__ import annotations

from installer.errors.base import InstallerError


class CommandFailed(InstallerError):
    reference = "command-failed"
    exit_code = 60
    default_hint = "See the command output above."

    def __init__(
        self,
        argv: list[str],
        returncode: int,
        output_tail: str,
        *,
        message: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.output_tail = output_tail
        text = message or f"`{' '.join(argv)}` exited with status {returncode}"
        if output_tail:
            text += "\n" + output_tail
        super().__init__(text, hint=hint)


class CommandNotFound(InstallerError):
    reference = "command-not-found"
    exit_code = 61
    default_hint = (
        "The image lacks a tool the installer needs; use the published image or install it."
    )
