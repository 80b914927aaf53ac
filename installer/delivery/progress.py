"""Transfer progress: a log line per 10% for `kubectl logs`, a one-line bar on a terminal."""

from __future__ import annotations

import logging
import sys
import time
from typing import Callable, Literal, Optional, TextIO

ProgressMode = Literal["auto", "log", "bar", "none"]

_MB = 1_000_000
# Without a Content-Length there is no percentage; log every this many bytes instead.
_UNKNOWN_TOTAL_STEP = 100 * _MB
_BAR_WIDTH = 30
_BAR_INTERVAL_S = 0.2


def resolve_mode(mode: str, stream: TextIO | None = None) -> ProgressMode:
    """`auto` becomes `bar` on a terminal and `log` otherwise (pods, pipes, files)."""
    if mode not in ("auto", "log", "bar", "none"):
        raise ValueError(f"unknown progress mode {mode!r}: use auto, log, bar or none")
    if mode != "auto":
        return mode  # type: ignore[return-value]
    stream = stream if stream is not None else sys.stderr
    try:
        return "bar" if stream.isatty() else "log"
    except (AttributeError, ValueError):
        return "log"


class Progress:
    """Counts bytes of one transfer and reports them without per-chunk cost.

    `update()` is called once per chunk and does one integer comparison unless a report is due.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        *,
        mode: str = "auto",
        start: int = 0,
        logger: logging.Logger | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total if total and total > 0 else None
        self.done = start
        self._start = start
        self._stream = stream if stream is not None else sys.stderr
        self._mode = resolve_mode(mode, self._stream)
        self._log = logger or logging.getLogger("installer.download")
        self._clock = clock
        self._t0 = clock()
        self._last_bar = 0.0
        self._bar_drawn = False
        self._next_tenth = 0
        self._next_mark: Optional[int] = None
        if self._mode == "log":
            if self.total is not None:
                # Report only tenths crossed by this transfer (a resumed one starts mid-way).
                self._next_tenth = start * 10 // self.total + 1
                self._next_mark = self._tenth_mark(self._next_tenth)
            else:
                self._next_mark = start + _UNKNOWN_TOTAL_STEP
        elif self._mode == "bar":
            self._next_mark = start

    def _tenth_mark(self, tenth: int) -> int | None:
        if self.total is None or tenth > 10:
            return None
        return -(-self.total * tenth // 10)  # ceil: 100% only when every byte is in

    def rate(self) -> float:
        """Bytes per second moved by this transfer (a resumed prefix does not count)."""
        elapsed = self._clock() - self._t0
        moved = self.done - self._start
        return moved / elapsed if elapsed > 0 else 0.0

    def update(self, nbytes: int) -> None:
        self.done += nbytes
        if self._next_mark is not None and self.done >= self._next_mark:
            self._report()

    def _report(self) -> None:
        if self._mode == "log":
            if self.total is None:
                self._log.info(
                    "%s: %.1f MB (%.1f MB/s)", self.label, self.done / _MB, self.rate() / _MB
                )
                self._next_mark = self.done + _UNKNOWN_TOTAL_STEP
                return
            pct = min(100, self.done * 100 // self.total)
            self._log.info(
                "%s: %d%% (%.1f/%.1f MB, %.1f MB/s)",
                self.label,
                pct,
                self.done / _MB,
                self.total / _MB,
                self.rate() / _MB,
            )
            self._next_tenth = min(self.done * 10 // self.total, 10) + 1
            self._next_mark = self._tenth_mark(self._next_tenth)
        else:
            now = self._clock()
            step = (self.total or 64 * _MB) // 200 or 1
            self._next_mark = self.done + step
            if now - self._last_bar >= _BAR_INTERVAL_S:
                self._last_bar = now
                self._draw()

    def _draw(self) -> None:
        rate = self.rate() / _MB
        if self.total is not None:
            frac = min(1.0, self.done / self.total)
            filled = int(frac * _BAR_WIDTH)
            line = (
                f"\r{self.label} [{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] "
                f"{frac * 100:3.0f}% {self.done / _MB:.1f}/{self.total / _MB:.1f} MB "
                f"{rate:.1f} MB/s"
            )
        else:
            line = f"\r{self.label} {self.done / _MB:.1f} MB {rate:.1f} MB/s"
        try:
            self._stream.write(line + "\x1b[K")
            self._stream.flush()
            self._bar_drawn = True
        except (OSError, ValueError):
            self._mode = "none"
            self._next_mark = None

    def finish(self) -> None:
        """Ends the bar line; in log mode says a total-less transfer ended."""
        if self._mode == "bar":
            self._draw()
            if self._bar_drawn:
                try:
                    self._stream.write("\n")
                    self._stream.flush()
                except (OSError, ValueError):
                    pass
        elif self._mode == "log" and self.total is None:
            self._log.info(
                "%s: %.1f MB done (%.1f MB/s)", self.label, self.done / _MB, self.rate() / _MB
            )
        self._next_mark = None
