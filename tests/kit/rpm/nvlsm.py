"""NVIDIA's `nvlsm` package as the CUDA repos ship it (rhel9/x86_64/nvlsm-<YYYY.MM.N>-1.x86_64.rpm),
for the kit's repo: /opt/nvidia/nvlsm/sbin/nvlsm (the kit's stand-in), its gRPC plugin under
/opt/nvidia/nvlsm/lib and its config files under /usr/share/nvidia/nvlsm. The layout is the one
Bottlerocket's nvlsm.spec unpacks from NVIDIA's rpm and Fabric Manager's service starts
(`/opt/nvidia/nvlsm/sbin/nvlsm -F /usr/share/nvidia/nvlsm/nvlsm.conf`). Versioned by date, apart
from the driver; no epoch, release 1; no scriptlets."""

from __future__ import annotations

from pathlib import Path

from ..nvlsm import PAYLOAD

# Two releases, so that a pin and "the newest" differ.
VERSIONS = ("2025.06.6", "2025.10.14")
RELEASE = "1"
BINARY = "/opt/nvidia/nvlsm/sbin/nvlsm"
LIBRARY = "/opt/nvidia/nvlsm/lib/libgrpc_mgr.so"
SHARE = "/usr/share/nvidia/nvlsm"
CONFIGS = ("nvlsm.conf", "grpc_mgr.conf", "device_configuration.conf")


def stage(version: str, package: Path) -> None:
    """The package's files under `package` (a staging root)."""

    def put(dest: str, data: bytes, mode: int) -> None:
        path = package / dest.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)

    put(BINARY, (PAYLOAD / "nvlsm").read_text().replace("@VERSION@", version).encode(), 0o755)
    put(LIBRARY, f"test kit stand-in for NVLSM {version}'s gRPC manager plugin\n".encode(),
        0o644)
    put(f"{SHARE}/nvlsm.conf", (PAYLOAD / "nvlsm.conf").read_bytes(), 0o644)
    for name in CONFIGS[1:]:
        put(f"{SHARE}/{name}", f"# {name} (test kit stand-in)\n".encode(), 0o644)
    put(f"{SHARE}/third-party-notices.txt", b"Test kit stand-in: no NVIDIA code.\n", 0o644)


def spec(version: str, body: str) -> str:
    """The %install and %files part after the spec head (`body`: builder.spec_head's)."""
    return (body + "\n%install\ncp -a %{_sourcedir}/nvlsm/. %{buildroot}/\n"
            "\n%files\n" + "\n".join(f"%attr({mode},root,root) {path}" for path, mode in (
                (BINARY, "0755"), (LIBRARY, "0644"),
                *((f"{SHARE}/{n}", "0644") for n in (*CONFIGS, "third-party-notices.txt"))))
            + "\n")
