"""Fabric Manager as NVIDIA's driver redist tree publishes it: `redistrib_<ver>.json` and
`fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-<ver>-archive.tar.xz`, whose daemon is
the kit's stand-in nv-fabricmanager (payload/fabricmanager)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from . import cache, native
from .redist_tar import tar_bytes

PAYLOAD = Path(__file__).with_name("payload") / "fabricmanager"
PLATFORM = "linux-x86_64"
# The topology files an x86_64 archive ships (their content is NVIDIA's binary format; the
# stand-in only needs them present).
TOPOLOGIES = ("dgx2_hgx2_topology", "dgxa100_hgxa100_topology", "dgxh100_hgxh100_topology",
              "dgxh800_hgxh800_topology")


def archive_name(version: str) -> str:
    return f"fabricmanager-{PLATFORM}-{version}-archive.tar.xz"


def relative_path(version: str) -> str:
    return f"fabricmanager/{PLATFORM}/{archive_name(version)}"


def build_fabricmanager(version: str, redist_dir: Path, *,
                        reports: Optional[str] = None) -> Path:
    """The archive and its redistrib JSON under `redist_dir` (NVIDIA's layout); returns the
    archive. `reports`: the version its nv-fabricmanager claims (default `version`), for an
    archive that is not what the JSON says. Built archives are cached like the runfiles."""
    said = reports or version
    inputs = [PAYLOAD, Path(__file__), native.NATIVE_SOURCES / "soname_stub.c"]
    key = f"fabricmanager-{version}-{said}-{cache.tree_digest(inputs)[:16]}"
    entry = cache.cached_dir(key, lambda work: _build(version, said, work))
    (redist_dir / "fabricmanager" / PLATFORM).mkdir(parents=True, exist_ok=True)
    archive = redist_dir / relative_path(version)
    shutil.copy2(entry / archive_name(version), archive)
    shutil.copy2(entry / f"redistrib_{version}.json", redist_dir / f"redistrib_{version}.json")
    return archive


def _build(version: str, said: str, out: Path) -> None:
    top = f"fabricmanager-{PLATFORM}-{version}-archive"
    files: dict[str, tuple[bytes, int]] = {}

    def text(name: str) -> bytes:
        return (PAYLOAD / name).read_text().replace("@VERSION@", said).encode()

    files["bin/nv-fabricmanager"] = (text("nv-fabricmanager"), 0o755)
    files["bin/nvswitch-audit"] = (text("nvswitch-audit"), 0o755)
    files["etc/fabricmanager.cfg"] = (text("fabricmanager.cfg"), 0o644)
    files["systemd/nvidia-fabricmanager.service"] = (text("nvidia-fabricmanager.service"), 0o644)
    files["LICENSE"] = (b"Test kit stand-in: no NVIDIA code.\n", 0o644)
    for name in TOPOLOGIES:
        files[f"share/nvidia/nvswitch/{name}"] = (f"NVFAKE topology {name}\n".encode(), 0o644)
    library = native.Library("libnvfm", "libnvfm.so.1", ("soname_stub.c",), "FM_LIB")
    built = native.compile_library(library, said, out)
    files["lib/libnvfm.so.1"] = (built.read_bytes(), 0o644)
    built.unlink()
    raw = tar_bytes(top, files, {"lib/libnvfm.so": "libnvfm.so.1"})
    archive = out / archive_name(version)
    subprocess.run(["xz", "-6", "--format=xz", "--check=crc64", "-c"], input=raw,
                   stdout=archive.open("wb"), check=True)
    data = archive.read_bytes()
    manifest = {
        "release_date": "2024-01-01",
        "release_label": version,
        "release_product": "nvidia-driver",
        "fabricmanager": {
            "name": "NVIDIA Fabric Manager",
            "license": "NVIDIA Driver",
            "license_path": "fabricmanager/LICENSE.txt",
            "version": version,
            PLATFORM: {
                "relative_path": relative_path(version),
                "sha256": hashlib.sha256(data).hexdigest(),
                "md5": hashlib.md5(data).hexdigest(),
                "size": str(len(data)),
            },
        },
    }
    (out / f"redistrib_{version}.json").write_text(json.dumps(manifest, indent=4) + "\n")
