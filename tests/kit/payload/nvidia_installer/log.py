"""Messages to the terminal and to the log file, in the real installer's ERROR:/WARNING: style."""

from __future__ import annotations

import os
import sys
import time
from typing import Optional, TextIO


class Log:
    """Everything goes to the log file; info to stdout unless --silent; problems to stderr."""

    def __init__(self, path: str, silent: bool) -> None:
        self.path = path
        self.silent = silent
        self.file: Optional[TextIO] = None
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self.file = open(path, "w")  # noqa: SIM115 - kept open for the whole run
        except OSError as error:
            print(f"WARNING: Unable to open the log file '{path}': {error}", file=sys.stderr)

    def header(self, version: str, argv: list[str]) -> None:
        self._write(f"nvidia-installer log file '{self.path}'")
        self._write(f"creation time: {time.strftime('%a %b %d %H:%M:%S %Y')}")
        self._write(f"installer version: {version}\n")
        self._write(f"PATH: {os.environ.get('PATH', '')}\n")
        self._write("nvidia-installer command line:")
        for arg in ["./nvidia-installer", *argv]:
            self._write(f"    {arg}")
        self._write("")

    def info(self, message: str) -> None:
        self._write(message)
        if not self.silent:
            print(message)

    def warning(self, message: str) -> None:
        self._write(f"WARNING: {message}")
        print(f"WARNING: {message}", file=sys.stderr)

    def error(self, message: str) -> None:
        self._write(f"ERROR: {message}")
        print(f"ERROR: {message}", file=sys.stderr)

    def detail(self, text: str) -> None:
        """Command output: the log only, as the real installer does with compiler output."""
        self._write(text.rstrip("\n"))

    def close(self) -> None:
        if self.file:
            self.file.close()

    def _write(self, line: str) -> None:
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()
