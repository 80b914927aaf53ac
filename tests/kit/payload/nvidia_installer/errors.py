"""The one failure type: its message is what the real installer prints after "ERROR: "."""

from __future__ import annotations


class InstallerError(Exception):
    """Ends the run with exit status 1 after logging `ERROR: <message>`."""
