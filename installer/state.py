"""Install records, GKE's `.cache` file, the readiness file and the host-wide lock."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from installer import safefs
from installer.errors import LockTimeout, PlantedLink
from installer.hostroot import write_atomic

log = logging.getLogger(__name__)

RECORD_FORMAT = 1


@dataclass(frozen=True)
class InstallRecord:
    """What the last verified install put on the host (a hint and a report, not the truth)."""

    version: str
    flavour: str
    kernel: str
    source: str
    install_dir: str
    gpus: tuple[str, ...] = ()
    module_files: tuple[str, ...] = ()
    firmware_dirs: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    verified_at: str = ""
    format: int = RECORD_FORMAT
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def read_record(path: Path) -> InstallRecord | None:
    """The record at `path`, or None when absent, unreadable or malformed (ignored)."""
    return load_record(path)[0]


def load_record(path: Path) -> tuple[InstallRecord | None, str]:
    """The record at `path` and what is wrong with it: (record, "") when well-formed,
    (None, "") when absent, (None, problem) when it cannot be read or a field is malformed.
    The file is on the host, where anything may have written it: raises nothing."""
    try:
        text = safefs.read_bytes(path).decode()
    except FileNotFoundError:
        return None, ""
    except PlantedLink:
        return None, "a link stands in its place (never read through)"
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({exc})"
    try:
        return parse_record(json.loads(text)), ""
    except ValueError as exc:
        return None, str(exc)


_STR_FIELDS = ("version", "flavour", "kernel", "source", "install_dir")
_LIST_FIELDS = ("gpus", "module_files", "firmware_dirs", "kernels")


def parse_record(data: object) -> InstallRecord:
    """An install record from its JSON value, every field checked for its type (commands and
    the metrics take its strings as they are). Raises ValueError naming the malformed field."""
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object but {type(data).__name__}")
    if data.get("format") != RECORD_FORMAT:
        raise ValueError(f"format {data.get('format')!r} is not {RECORD_FORMAT}")
    unknown = sorted(set(data) - {f.name for f in fields(InstallRecord)})
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    values: dict[str, Any] = {"format": RECORD_FORMAT}
    for key in (*_STR_FIELDS, "verified_at"):
        value = data.get(key, "" if key == "verified_at" else None)
        if not isinstance(value, str):
            raise ValueError(f"{key} is {'absent' if value is None else type(value).__name__}"
                             ", not a string")
        values[key] = value
    for key in _LIST_FIELDS:
        items = data.get(key, [])
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"{key} is not a list of strings")
        values[key] = tuple(items)
    extra = data.get("extra", {})
    if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
        raise ValueError("extra is not an object of strings")
    values["extra"] = dict(extra)
    return InstallRecord(**values)


def write_record(path: Path, record: InstallRecord) -> None:
    write_atomic(path, record.to_json())


def gke_cache_text(kernel: str, version: str) -> str:
    """GKE's entrypoint records its install in `<install dir>/.cache` with these two lines."""
    return f"CACHE_KERNEL_VERSION={kernel}\nCACHE_NVIDIA_DRIVER_VERSION={version}\n"


def read_gke_cache(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        text = safefs.read_bytes(path).decode(errors="replace")
    except (OSError, PlantedLink):  # a link there is no record
        return values
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def ready_text(version: str, flavour: str, install_dir: str, kernel: str) -> str:
    return (
        f"DRIVER_VERSION={version}\nKERNEL_MODULE_TYPE={flavour}\n"
        f"KERNEL_RELEASE={kernel}\nINSTALL_DIR={install_dir}\n"
    )


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class HostLock:
    """An exclusive flock on a file in the install dir, shared by every installer on the host.

    A second installer waits (logging once who it waits for) and fails with LockTimeout
    after `timeout` seconds. The kernel drops the lock when the holder dies, even by SIGKILL.
    """

    def __init__(self, path: Path, timeout: float, poll: float = 0.2) -> None:
        self.path = path
        self.timeout = timeout
        self.poll = poll
        self._handle: IO[str] | None = None

    def __enter__(self) -> HostLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Never through a link: GPU pods mount the install dir, and a link here would make
        # the truncation below root's write to any host file (PlantedLink instead).
        fd = safefs.open_file(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        handle = os.fdopen(fd, "r+")
        deadline = time.monotonic() + self.timeout
        waited = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    log.info("waiting for another installer (pid %s) holding %s",
                             _holder_pid(handle), self.path)
                    waited = True
                if time.monotonic() >= deadline:
                    handle.close()
                    raise LockTimeout(
                        f"another installer held {self.path} for more than {self.timeout:.0f} s",
                    ) from None
                time.sleep(self.poll)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def _holder_pid(handle: IO[str]) -> str:
    handle.seek(0)
    return handle.read().strip() or "unknown"
