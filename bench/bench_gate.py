"""What the scheduling-gate container (`installer gate`) costs on a node: its peak memory (the
figure its memory limit in daemonset/components/scheduling-gate rests on) and its CPU while it
idles on an open node, polling the readiness files every 5 s and reading the Node from the API
server every 5 minutes. The API server is the stand-in of tests/cluster on 127.0.0.1.

Baseline in the same run: `installer status` (the installer's own interpreter and imports, no
API client), on the same host root.

    python3 bench/bench_gate.py [--idle 60]
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from cluster.apiserver import ApiServer, Cluster  # noqa: E402
from lib.hosttrees import (  # noqa: E402
    H100,
    make_host,
    module_line,
    write_driver_version,
    write_proc_modules,
)

from installer import components  # noqa: E402

NODE = "gpu-node-1"
VERSION = "580.105.08"


def _status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds to watch it idle")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "host"
        make_host(root, gpus=[H100])
        write_proc_modules(root, [module_line("nvidia_uvm"), module_line("nvidia")])
        write_driver_version(root, VERSION, "open")
        ready = root / "run/nvidia-driver-installer/driver-ready"
        ready.parent.mkdir(parents=True)
        ready.write_text(f"DRIVER_VERSION={VERSION}\n")
        for name in components.names():  # each component's container reported ready
            (ready.parent / f"{name}-ready").write_text(f"DRIVER_VERSION={VERSION}\n")
        cluster = Cluster()
        node = cluster.add_node(NODE, {})
        node["spec"]["taints"] = [{"key": "nvidia.com/gpu.driver-not-ready",
                                   "effect": "NoSchedule"}]
        with ApiServer(cluster) as server:
            env = {**os.environ, "PYTHONPATH": str(REPO), "ROOT_MOUNT_DIR": str(root),
                   "NODE_NAME": NODE, "NVIDIA_INSTALLER_SCHEDULING_GATE": "true",
                   "NVIDIA_INSTALLER_KUBECONFIG": str(server.kubeconfig(Path(scratch)))}
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            subprocess.run([sys.executable, "-m", "installer", "status"], env=env, check=True,
                           capture_output=True)
            status_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            started = time.monotonic()
            gate = subprocess.Popen([sys.executable, "-m", "installer", "gate"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                while cluster.node(NODE)["spec"].get("taints"):
                    if time.monotonic() - started > 60 or gate.poll() is not None:
                        raise SystemExit("the gate did not open")
                    time.sleep(0.05)
                opened = time.monotonic() - started
                cpu_open = _cpu(gate.pid)
                time.sleep(args.idle)
                cpu_idle = _cpu(gate.pid) - cpu_open
                info = _status(gate.pid)
            finally:
                gate.send_signal(signal.SIGTERM)
                gate.communicate(timeout=30)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"Python {sys.version.split()[0]}")
    print(f"installer status (baseline): peak RSS {status_kb / 1024:.1f} MiB"
          + (" (an earlier child was larger)" if before >= status_kb else ""))
    hwm, rss = (int(info[k].split()[0]) / 1024 for k in ("VmHWM", "VmRSS"))
    print(f"installer gate: opened the gate {opened:.2f} s after start "
          f"({cpu_open:.2f} CPU s); peak RSS {hwm:.1f} MiB, now {rss:.1f} MiB")
    print(f"installer gate idle {args.idle:g} s: {cpu_idle:.3f} CPU s "
          f"({100 * cpu_idle / args.idle:.3f}% of one core)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
