"""A pulled build in the cache, checked again before a run uses it: its signed record against
the trust root of the day, the node's key, the module names, sizes and digests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from installer.plan import Context
from installer.sources.prebuilt.key import EVIDENCE_FILE, STAT_FILE, artifact_key, policy

if TYPE_CHECKING:
    from installer.delivery import Artifact

def cached_problem(ctx: Context, build: Path) -> str | None:
    """Why a pulled build in the cache may no longer be used (None: it verifies). Reads only;
    the answer is kept for the run."""
    memo = ctx.memo.get("prebuilt-cached")
    if isinstance(memo, tuple) and memo[0] == build:
        return memo[1]  # type: ignore[no-any-return]
    problem = _check_cached(ctx, build)
    ctx.memo["prebuilt-cached"] = (build, problem)
    return problem


def _check_cached(ctx: Context, build: Path) -> str | None:
    from installer.delivery import artifact
    from installer.errors import InstallerError

    try:
        trusted = policy(ctx)
        if trusted is None:
            return "no NVIDIA_MODULE_TRUSTED_KEYS: pulled modules are not used"
        if not (build / EVIDENCE_FILE).is_file():
            return "no signed record beside them (pulled before signatures were checked)"
        verified = artifact.verify(artifact.Evidence.from_json(
            (build / EVIDENCE_FILE).read_text()), trusted)
        if verified.key != artifact_key(ctx).fields():
            return f"built for {verified.key}, not for this node's key"
        return _files_problem(build, verified)
    except (InstallerError, OSError) as exc:
        return getattr(exc, "message", None) or str(exc)


def _files_problem(build: Path, verified: Artifact) -> str | None:
    from installer.delivery import file_sha256

    present = sorted(p.name for p in build.glob("*.ko"))
    listed = sorted(f.name for f in verified.files)
    if present != listed:
        return f"the cache holds {present}, the signed artifact {listed}"
    stats = _read_stats(build)
    for item in verified.files:
        path = build / item.name
        info = path.stat()
        if info.st_size != item.size:
            return f"{item.name} is {info.st_size} bytes, signed as {item.size}"
        if stats.get(item.name) == [info.st_size, info.st_mtime_ns]:
            continue  # hashed when written and unchanged since
        if file_sha256(path) != item.sha256:
            return f"{item.name} no longer hashes to its signed digest"
    return None




def _read_stats(build: Path) -> dict[str, list[int]]:
    try:
        data = json.loads((build / STAT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
