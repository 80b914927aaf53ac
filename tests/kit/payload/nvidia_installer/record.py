"""What an install put down, so --uninstall and --sanity can find it again.

The real installer keeps this under /var/lib/nvidia; the kit keeps it under the utility prefix
so installs into temporary prefixes stay self-contained.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple, Optional

from .options import Options
from .userspace import make_dirs


class Record(NamedTuple):
    version: str
    kernel_name: str
    files: list[str]


def record_path(options: Options) -> str:
    return os.path.join(options.utility_prefix, "share/nvidia/nvidia-installer.files.json")


def load(options: Options) -> Optional[Record]:
    try:
        with open(record_path(options)) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return Record(data["version"], data["kernel_name"], list(data["files"]))


def save(options: Options, record: Record) -> None:
    path = record_path(options)
    make_dirs(os.path.dirname(path))
    with open(path, "w") as handle:
        json.dump(record._asdict(), handle, indent=1)


def remove_files(record: Record) -> list[str]:
    removed = []
    for path in record.files:
        if os.path.lexists(path):
            os.remove(path)
            removed.append(path)
    return removed


def delete(options: Options) -> None:
    if os.path.exists(record_path(options)):
        os.remove(record_path(options))
