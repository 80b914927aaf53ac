"""NVLSM as NVIDIA's redist trees publish it: `nvlsm/linux-x86_64/nvlsm-linux-x86_64-<ver>-
archive.tar.xz` (its daemon the kit's stand-in, payload/nvlsm), and its entry in a driver's
`redistrib_<driver>.json` (added beside the fabricmanager entry when that JSON exists)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from .redist_tar import tar_bytes

PAYLOAD = Path(__file__).with_name("payload") / "nvlsm"
PLATFORM = "linux-x86_64"


def archive_name(version: str) -> str:
    return f"nvlsm-{PLATFORM}-{version}-archive.tar.xz"


def relative_path(version: str) -> str:
    return f"nvlsm/{PLATFORM}/{archive_name(version)}"


def build_nvlsm(version: str, tree: Path, *, driver: str | None = None,
                bin_dir: str = "bin") -> Path:
    """The archive under `tree` (NVIDIA's layout); with `driver`, its entry in
    tree/redistrib_<driver>.json too. Returns the archive."""
    top = archive_name(version)[: -len(".tar.xz")]
    files = {
        f"{bin_dir}/nvlsm": ((PAYLOAD / "nvlsm").read_text().replace("@VERSION@", version)
                             .encode(), 0o755),
        "share/nvidia/nvlsm/nvlsm.conf": ((PAYLOAD / "nvlsm.conf").read_bytes(), 0o644),
        "share/nvidia/nvlsm/grpc_mgr.conf": (b"# grpc_mgr.conf (test kit stand-in)\n", 0o644),
        "LICENSE": (b"Test kit stand-in: no NVIDIA code.\n", 0o644),
    }
    raw = tar_bytes(top, files)
    archive = tree / relative_path(version)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with archive.open("wb") as out:
        subprocess.run(["xz", "-6", "-c"], input=raw, stdout=out, check=True)
    if driver is not None:
        data = archive.read_bytes()
        listing = tree / f"redistrib_{driver}.json"
        document = json.loads(listing.read_text()) if listing.exists() else {
            "release_date": "2025-10-01", "release_label": driver,
            "release_product": "nvidia-driver"}
        document["nvlsm"] = {
            "name": "NVIDIA NVLink Subnet Manager", "license": "NVIDIA Driver",
            "version": version,
            PLATFORM: {"relative_path": relative_path(version),
                       "sha256": hashlib.sha256(data).hexdigest(),
                       "md5": hashlib.md5(data).hexdigest(), "size": str(len(data))},
        }
        listing.write_text(json.dumps(document, indent=4) + "\n")
    return archive
