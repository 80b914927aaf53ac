"""The `installer` command (and `python -m installer`): flags and environment become a Config,
and the one place errors become exit codes. The click commands are in `commands.py`; the
images' default command, a bare `installer run`, starts without importing click (a sixth of
a warm run)."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.cli.options import _termination_log, make_config
from installer.errors import InstallerError

if TYPE_CHECKING:
    from installer.cli.commands import InstallerGroup, cli

__all__ = ["InstallerGroup", "cli", "main", "make_config", "report_error", "termination_message"]

TERMINATION_LOG_ENV = "NVIDIA_INSTALLER_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LIMIT = 4096
# click's shell completion for `installer` runs when this is set, whatever the arguments.
COMPLETION_ENV = "_INSTALLER_COMPLETE"

def __getattr__(name: str) -> Any:
    """`cli` (the click group) and `InstallerGroup` load the commands on first use."""
    if name not in ("cli", "InstallerGroup"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from installer.cli import commands

    return getattr(commands, name)


def run_without_click() -> None:
    """`installer run` with no flags, as the `run` command runs it (every setting from the
    environment) and as click ends it when interrupted: a newline, `aborted`, exit 130; a
    closed pipe: exit 1. Without click: its import and the flags of every command (about 23 ms
    on the bench machine) were a sixth of a warm run."""
    from installer import app

    try:
        app.run(make_config({}))
    except (EOFError, KeyboardInterrupt):
        sys.stderr.write("\naborted\n")
        sys.exit(130)
    except OSError as error:
        if error.errno != errno.EPIPE:
            raise
        from click.utils import PacifyFlushWrapper  # click's end of a command on a closed pipe

        sys.stdout = PacifyFlushWrapper(sys.stdout)  # type: ignore[assignment, operator]
        sys.stderr = PacifyFlushWrapper(sys.stderr)  # type: ignore[assignment, operator]
        sys.exit(1)


def report_error(error: InstallerError) -> None:
    """`error[<reference>]: message` + `hint:` on stderr and in Kubernetes' termination log."""
    import click  # strips terminal escapes from the message where stderr is not a terminal

    hint = f"\nhint: {error.hint}" if error.hint else ""
    text = f"error[{error.reference}]: {error.message}{hint}"
    click.echo(text, err=True)
    path = Path(_termination_log.get("path")
                or os.environ.get(TERMINATION_LOG_ENV, DEFAULT_TERMINATION_LOG))
    if path.is_file():
        with contextlib.suppress(OSError):
            path.write_bytes(termination_message(f"error[{error.reference}]: {error.message}",
                                                 hint))


def termination_message(head: str, tail: str) -> bytes:
    """`head` cut at its end, then `tail` (the hint), within Kubernetes' 4096-byte limit:
    the reference at the start always survives."""
    ending = tail.encode("utf-8", errors="replace") + b"\n"
    data = head.encode("utf-8", errors="replace")
    if len(data) + len(ending) > TERMINATION_LIMIT:
        ending = (b"\n[... cut to fit the termination message]" + ending)[-TERMINATION_LIMIT // 2:]
        ending = ending.decode("utf-8", errors="ignore").encode()
        # Never end inside a multi-byte UTF-8 sequence.
        data = data[: TERMINATION_LIMIT - len(ending)].decode("utf-8", errors="ignore").encode()
    return data + ending


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    _termination_log.clear()
    try:
        if args == ["run"] and COMPLETION_ENV not in os.environ:
            run_without_click()
        else:
            from installer.cli import commands

            commands.main(args)
    except InstallerError as error:
        report_error(error)
        sys.exit(error.exit_code)
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    finally:
        # One command's --termination-log never outlives it (main runs in-process in tests).
        _termination_log.clear()
    sys.exit(0)
