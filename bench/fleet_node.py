"""One node's installer side in bench/bench_fleet_rollout.py, run as its own process while the
node acts (as the new DaemonSet pod's installer would): the installer's real upgrade-protocol
code against the real API server through the bench's proxy, with the pod-bound token of that
node, and the module unload, build and load stubbed by a sleep standing for the install time.

    python3 bench/fleet_node.py '<json: node, kubeconfig, root, install_seconds, old, new,
                                  server, ca, admin_cert, admin_key>'

The order is the ClusterGate's (installer/cluster/upgrade_gate.py): preflight (read the node)
before anything is staged, make_room (cordon, pause GPU clients by label, evict GPU pods under
their PDBs, wait for /dev/nvidia* holders), the unload, build and load, then finish (restore
labels, uncordon); on an error, `failed` marks the node. At the moment of the unload it lists
the node's pods as the administrator (straight to the server, not through the proxy: the check
is the bench's, not the installer's traffic) and reports every GPU pod still there.

Prints one JSON line on stdout: monotonic-clock times of its phases, its peak RSS and CPU,
the GPU pods found at the unload, the error if any."""

from __future__ import annotations

import json
import logging
import resource
import ssl
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

STARTED = time.monotonic()  # before the installer's imports
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from installer.cluster import drain, protocol  # noqa: E402
from installer.config import build_config  # noqa: E402
from installer.errors import InstallerError  # noqa: E402
from installer.hostroot import HostRoot  # noqa: E402
from installer.layout import Layout  # noqa: E402


def gpu_pods_at_unload(args: dict[str, Any]) -> list[str]:
    """Every pod on the node that asks for a GPU and has not ended (Running, Pending or still
    terminating): any of them would lose its driver at this moment."""
    context = ssl.create_default_context(cafile=args["ca"])
    context.load_cert_chain(args["admin_cert"], args["admin_key"])
    query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={args['node']}"})
    with urllib.request.urlopen(f"{args['server']}/api/v1/pods?{query}", context=context,
                                timeout=30) as answer:
        pods = json.loads(answer.read())["items"]
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']} "
            f"({(p.get('status') or {}).get('phase')})" for p in pods
            if drain.requests_gpu(p)
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def main() -> int:
    args = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    times: dict[str, float] = {"started": STARTED, "imported": time.monotonic()}
    root = Path(args["root"])
    (root / "proc").mkdir(parents=True, exist_ok=True)  # no process holds /dev/nvidia*
    config = build_config({"NVIDIA_INSTALLER_UPGRADE_PROTOCOL": "true",
                           "NODE_NAME": args["node"],
                           "NVIDIA_INSTALLER_KUBECONFIG": args["kubeconfig"],
                           "ROOT_MOUNT_DIR": str(root),
                           "NVIDIA_INSTALL_DIR_CONTAINER": str(root / "no-mount")}, {})
    host = HostRoot(config.root)
    layout = Layout.from_config(config, host)
    layout.install_local.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"node": args["node"], "gpu_pods_at_unload": [], "error": None}
    try:
        protocol.preflight(config)
        protocol.make_room(config, host, layout, args["old"], args["new"])
        times["room_made"] = time.monotonic()
        result["gpu_pods_at_unload"] = gpu_pods_at_unload(args)
        time.sleep(args["install_seconds"])  # unload, build, load: the kit's stub
        (root / "driver-version").write_text(args["new"] + "\n")
        times["loaded"] = time.monotonic()
        protocol.finish(config, layout)
        times["finished"] = time.monotonic()
    except InstallerError as error:
        result["error"] = f"{error.reference}: {error.message}"
        protocol.failed(config, layout, error)
    result["times"] = times
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["peak_rss_mib"] = usage.ru_maxrss / 1024
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    print(json.dumps(result), flush=True)
    return 0 if result["error"] is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
