"""Logging to stderr: one line per event with a timestamp, or JSON lines for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
import time

_TEXT_FORMAT = "%(asctime)s %(levelname)-5s %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        step = getattr(record, "step", None)
        if step:
            entry["step"] = step
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, sort_keys=True)


class UtcFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + "Z"


def setup(log_format: str = "text", verbose: bool = False) -> None:
    """Route the `installer` loggers to stderr in the chosen format (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(UtcFormatter(_TEXT_FORMAT))
    logger = logging.getLogger("installer")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
