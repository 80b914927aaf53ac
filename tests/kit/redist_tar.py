"""The tar inside a stand-in of NVIDIA's redist archives (Fabric Manager, NVLSM, IMEX): every
directory, file and link under one top directory, with a fixed mtime so equal inputs give equal
archives."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

MTIME = 1704067200

Files = dict[str, tuple[bytes, int]]  # path under the top directory -> (content, mode)


def tar_bytes(top: str, files: Files, links: dict[str, str] | None = None) -> bytes:
    """The uncompressed tar: `top` and each file's parent directories first, then the files,
    then the symlinks (path under `top` -> target), each in sorted order."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for directory in sorted({str(Path(top, n).parent) for n in files} | {top}):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, MTIME
            tar.addfile(info)
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime = len(data), mode, MTIME
            tar.addfile(info, io.BytesIO(data))
        for name, target in sorted((links or {}).items()):
            link = tarfile.TarInfo(f"{top}/{name}")
            link.type, link.linkname, link.mtime = tarfile.SYMTYPE, target, MTIME
            tar.addfile(link)
    return raw.getvalue()
