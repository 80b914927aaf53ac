"""The HGX B200 part of tests/vm/test_pod_scenarios.py's second boot: what the guest gets (the
board's ConnectX-7 functions, the IB modules built by the guest kernel's kbuild, NVLSM's
archive), the DaemonSet as rendered with NVLSM pinned, and the scenario lines that turn the
NVSwitch board into a B200 one and run the pod twice: before mlx5_ib made the Limited PF's IB
device, then after."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kit.nvlink5 import IB_MODULES
from kit.nvlsm import build_nvlsm

from vm.b200 import LPF_GUID, SM, ib_modules, write_board

__all__ = ["LPF_GUID", "SM", "b200_manifest", "prepare_b200", "scenario"]

MIRROR = "http://127.0.0.1:8000"
REDIST = f"{MIRROR}/redist"


def prepare_b200(files: Path, kernel_build_dir: Path, driver: str) -> str:
    """files/b200/{pci,ib} (the board), files/b200/modules (mlx5_core, mlx5_ib, ib_umad) and
    NVLSM's archive in files/www/redist (listed in redistrib_<driver>.json too). Returns the
    archive's SHA-256, the pin the DaemonSet carries."""
    work = files.parent / "b200-work"
    write_board(files / "b200", work / "sysfs")
    ib_modules(kernel_build_dir, work / "ib")
    (files / "b200" / "modules").mkdir()
    for name in IB_MODULES:
        (files / "b200" / "modules" / f"{name}.ko").write_bytes(
            (work / "ib" / f"{name}.ko").read_bytes())
    archive = build_nvlsm(SM, files / "www" / "redist", driver=driver)
    return hashlib.sha256(archive.read_bytes()).hexdigest()


def b200_manifest(fabric: list[dict[str, Any]], sha256: str, guest_files: str
                  ) -> list[dict[str, Any]]:
    """The fabric DaemonSet (B pinned, protocol off, Fabric Manager from the guest's redist
    tree) with NVLSM pinned in the initContainer (its pin vouches for it: the redist JSON on
    127.0.0.1 is plain http), the runfile from the guest's mirror and the operator's digests
    file (the guest's, through the root mount) vouching for the .run and Fabric Manager."""
    docs: list[dict[str, Any]] = json.loads(json.dumps(fabric))
    for doc in docs:
        if doc.get("kind") == "DaemonSet":
            doc["metadata"]["name"] = "nvidia-driver-installer-b200"
            spec = doc["spec"]["template"]["spec"]
            for container in spec["initContainers"]:
                container["env"] += [{"name": "NVIDIA_DRIVER_MIRRORS", "value": MIRROR},
                                     {"name": "NVIDIA_DRIVER_DIGESTS_FILE",
                                      "value": f"/root{guest_files}/www/digests"},
                                     {"name": "NVIDIA_NVLSM_VERSION", "value": SM},
                                     {"name": "NVIDIA_NVLSM_REDIST", "value": REDIST},
                                     {"name": "NVIDIA_NVLSM_SHA256", "value": sha256}]
    return docs


def scenario(guest_files: str, driver: str) -> str:
    """Appended to the second boot once the NVSwitch pod is stopped and the driver unloaded."""
    copies = "".join(f"install -D -m 644 {guest_files}/b200/modules/{name}.ko "
                     f"/lib/modules/$kernel/{path}\n" for name, path in IB_MODULES.items())
    return f"""
# An HGX B200 board: no NVSwitch function; the GPU is a B200 and the two ConnectX-7 bridges
# (a full PF and a Limited PF each) join the PCI tree, bound to no IB driver yet.
rm -rf /run/vm-pci/0000:00:08.0 /run/vm-pci/0000:00:09.0
echo 0x2901 > /run/vm-pci/0000:00:04.0/device
cp -a {guest_files}/b200/pci/. /run/vm-pci/
# The kernel's InfiniBand modules where modprobe finds them.
kernel=$(uname -r)
{copies}depmod $kernel
# /sys/class writable for the classes mlx5_ib and ib_umad add (relative links resolve as before).
mkdir /run/sysclass
cp -a /sys/class/. /run/sysclass/ 2>/dev/null || true
mount --bind /run/sysclass /sys/class
# The pods' containers see the guest's /sys/class (pod/run.py: sys_class).
export POD_ARGS="--sys-class /run/sysclass"
# The uninstall took the install dir: {driver}'s modules as a prebuild leaves them (the
# in-container compile is proven by the first boot); the pod fetches the rest.
mkdir -p $NVIDIA_INSTALL_DIR_HOST/cache/modules
cp -a {guest_files}/modules/{driver} $NVIDIA_INSTALL_DIR_HOST/cache/modules/
b200_ready() {{
  pod probe ours-b200 | python3 -c 'import json, sys
sys.exit(0 if all(r["exit_code"] == 0 for r in json.load(sys.stdin).values()) else 1)'
}}
fm_state() {{ runc --root /run/pod/ours-b200/runtime state fabricmanager | grep '"status"'; }}

# (a) mlx5_ib made no IB device for the Limited PF: no port GUID, NVLSM cannot start.
step b200-pod pod run ours-b200
for _ in $(seq 120); do fm_state | grep -q '"stopped"' && break; sleep 1; done
echo "@@ b200-stopped"; fm_state || true
cat /run/pod/ours-b200/fabricmanager/termination-log
echo "@@ b200-modules"; grep -E '^(mlx5_core|mlx5_ib|ib_umad) ' /proc/modules | cut -d' ' -f1
echo "@@ b200-nvlsm-installed"; ls $NVIDIA_INSTALL_DIR_HOST/versions/{driver}/bin
cat $NVIDIA_INSTALL_DIR_HOST/versions/{driver}/share/nvidia/nvlsm/.nvlsm-version || true
echo "@@ b200-markers-before"; ls -1 /run/nvidia-driver-installer
step b200-probes-before pod probe ours-b200
step b200-verify-before installer verify --json
pod stop ours-b200 >/dev/null

# (b) mlx5_ib made the IB devices and ib_umad its class: the pod again (as the kubelet starts
# the failed container again), NVLSM on the Limited PF's GUID, then Fabric Manager.
cp -a {guest_files}/b200/ib/. /run/vm-pci/
mkdir -p /sys/class/infiniband /sys/class/infiniband_mad
echo 5 > /sys/class/infiniband_mad/abi_version
for f in /run/vm-pci/*/infiniband/*; do
  a=${{f#/run/vm-pci/}}; ln -s "../../bus/pci/devices/$a" "/sys/class/infiniband/${{f##*/}}"
done
step b200-pod-again pod run ours-b200
for _ in $(seq 180); do b200_ready && break; sleep 1; done
step b200-probes pod probe ours-b200
echo "@@ b200-daemons"
for d in bin/nvlsm bin/nv-fabricmanager; do
  tr '\\0' ' ' < /proc/$(pgrep -f "versions/{driver}/$d " | head -1)/cmdline || true; echo
done
step b200-verify installer verify --json
echo "@@ b200-markers"; cat /run/nvidia-driver-installer/fabricmanager-ready || true
echo "@@ b200-fm-log"; cat /run/pod/ours-b200/fabricmanager/log
pod stop ours-b200 >/dev/null
"""

