"""What the kernel logs while we load a module: /dev/kmsg read from where it ended before."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

KMSG = Path("/dev/kmsg")
_RECORD_BYTES = 8192  # /dev/kmsg returns one record per read (at most 1 KiB of text)


@contextlib.contextmanager
def watching(path: Path | None = None) -> Iterator[KernelLog]:
    """The kernel log's new records while the block runs (nothing when /dev/kmsg cannot be
    read, e.g. an unprivileged container)."""
    watch = KernelLog(path or KMSG)
    try:
        yield watch
    finally:
        watch.close()


class KernelLog:
    def __init__(self, path: Path) -> None:
        try:
            self.fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            self.fd = None

    def lines(self, pattern: str = r"NVRM|nvidia", limit: int = 8) -> list[str]:
        """Messages logged since the watch began that match `pattern` (the last `limit`)."""
        if self.fd is None:
            return []
        found: list[str] = []
        wanted = re.compile(pattern)
        while True:
            try:
                record = os.read(self.fd, _RECORD_BYTES)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: records overwritten while we read; go on
                continue
            if not record:
                break
            for line in record.decode("utf-8", "replace").splitlines():
                # `<prio>,<seq>,<usec>,<flags>;<message>`, then ` KEY=value` dictionary lines.
                if line.startswith(" ") or ";" not in line:
                    continue
                message = line.split(";", 1)[1].strip()
                if wanted.search(message):
                    found.append(message)
        return found[-limit:]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
