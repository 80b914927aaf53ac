"""IMEX as NVIDIA's driver redist tree publishes it: an archive under imex/linux-x86_64/ (the
kit's stand-in nvidia-imex and nvidia-imex-ctl, payload/imex) and its entry in the driver's
`redistrib_<ver>.json` (added beside the others when that JSON exists)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from .redist_tar import tar_bytes

PAYLOAD = Path(__file__).with_name("payload") / "imex"
PLATFORM = "linux-x86_64"


def relative_path(version: str) -> str:
    return f"imex/{PLATFORM}/nvidia-imex-{PLATFORM}-{version}-archive.tar.xz"


def build_imex(version: str, tree: Path, *, listed: str | None = None) -> Path:
    """The archive under `tree` and its entry in tree/redistrib_<version>.json; `listed`: the
    version the entry claims (default `version`). Returns the archive."""
    name = Path(relative_path(version)).name
    top = name[: -len(".tar.xz")]
    files = {f"bin/{binary}": ((PAYLOAD / binary).read_text().replace("@VERSION@", version)
                                .encode(), 0o755) for binary in ("nvidia-imex", "nvidia-imex-ctl")}
    raw = tar_bytes(top, files)
    archive = tree / relative_path(version)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with archive.open("wb") as out:
        subprocess.run(["xz", "-6", "-c"], input=raw, stdout=out, check=True)
    data = archive.read_bytes()
    listing = tree / f"redistrib_{version}.json"
    document = json.loads(listing.read_text()) if listing.exists() else {
        "release_label": version, "release_product": "nvidia-driver"}
    document["imex"] = {
        "name": "NVIDIA IMEX", "license": "NVIDIA Driver", "version": listed or version,
        PLATFORM: {"relative_path": relative_path(version),
                   "sha256": hashlib.sha256(data).hexdigest(),
                   "md5": hashlib.md5(data).hexdigest(), "size": str(len(data))},
    }
    listing.write_text(json.dumps(document, indent=4) + "\n")
    return archive
