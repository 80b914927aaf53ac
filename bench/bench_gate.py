"""What the scheduling-gate container (`installer gate`) costs on a node: its peak memory (the
figure its memory limit in daemonset/components/scheduling-gate rests on) and its CPU while it
idles on an open node, polling the readiness files every 5 s and reading the Node from the API
server every 5 minutes. The API server is a real kube-apiserver (tests/lib/controlplane.py,
built by scripts/control-plane) on 127.0.0.1, started for the run: a Node tainted as a pool
registers it, the shipped scheduling-gate RBAC and admission policy, and a token bound to a Pod
on the Node, as the container gets it.

Baseline in the same run: `installer status` (the installer's own interpreter and imports, no
API client), on the same host root.

    python3 bench/bench_gate.py [--idle 60]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the checkout, not an installed copy

from lib import controlplane  # noqa: E402
from lib.controlplane import ControlPlane, kubeconfig  # noqa: E402
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
GATE = REPO / "daemonset" / "components" / "scheduling-gate"
GATE_TAINT = {"key": "nvidia.com/gpu.driver-not-ready", "effect": "NoSchedule"}


def _gate_token(cp: ControlPlane) -> str:
    """The shipped RBAC and policy applied and enforced, the Node registered tainted, and the
    installer's token bound to a Pod on it."""
    for name in ("rbac.yaml", "admission-policy.yaml"):
        done = cp.apply("apply", "--server-side", "-f", str(GATE / name))
        if done.returncode != 0:
            raise SystemExit(done.stderr)
    cp.node(NODE, taints=[GATE_TAINT])
    token = cp.pod_token(NODE)
    # The admission plugin learns of the binding through its informer: wait until it refuses
    # this token's write to another node (a dry run).
    cp.node(f"{NODE}-other")
    deadline = time.monotonic() + 60
    while True:
        try:
            cp.request("PATCH", f"/api/v1/nodes/{NODE}-other", {"metadata": {"labels": {
                "nvidia-driver-installer/driver-version": VERSION}}}, token=token,
                content_type="application/merge-patch+json", query={"dryRun": "All"})
        except controlplane.ApiError as e:
            if e.status == 403 and "ValidatingAdmissionPolicy" in str(e):
                return token
        if time.monotonic() > deadline:
            raise SystemExit("the scheduling-gate policy was never enforced")
        time.sleep(0.2)


def _taints(cp: ControlPlane) -> list[dict[str, str]]:
    taints = cp.get(f"/api/v1/nodes/{NODE}")["spec"].get("taints") or []
    return [t for t in taints if t["key"] == GATE_TAINT["key"]]


def _status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Runs the installer's command in a Python that reports its own VmHWM when it exits. Not
# wait4's ru_maxrss: Linux keeps the high-water mark across exec, so that figure includes the
# RSS of this process (the control plane's PKI and tooling imported) at the fork.
_REPORTING = ("import atexit, runpy, sys\n"
              "atexit.register(lambda: sys.stderr.write(next(line for line in "
              "open('/proc/self/status') if line.startswith('VmHWM:'))))\n"
              "sys.argv = ['installer', *sys.argv[1:]]\n"
              "runpy.run_module('installer', run_name='__main__', alter_sys=True)\n")


def _peak_rss_kb(command: str, env: dict[str, str]) -> int:
    """`installer <command>`'s own peak RSS in KiB (its VmHWM)."""
    done = subprocess.run([sys.executable, "-c", _REPORTING, command], env=env, text=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    if done.returncode != 0:
        raise SystemExit(f"installer {command} exited {done.returncode}: {done.stderr}")
    return int(done.stderr.strip().splitlines()[-1].split()[1])


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
        cp = controlplane.start()
        try:
            token = _gate_token(cp)
            env = {**os.environ, "PYTHONPATH": str(REPO), "ROOT_MOUNT_DIR": str(root),
                   "NODE_NAME": NODE, "NVIDIA_INSTALLER_SCHEDULING_GATE": "true",
                   "NVIDIA_INSTALLER_KUBECONFIG": str(kubeconfig(
                       Path(scratch) / "kubeconfig", cp.url, cp.ca, token=token))}
            status_kb = _peak_rss_kb("status", env)
            started = time.monotonic()
            gate = subprocess.Popen([sys.executable, "-m", "installer", "gate"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                while _taints(cp):
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
        finally:
            cp.stop()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"Python {sys.version.split()[0]}")
    print(f"installer status (baseline): peak RSS {status_kb / 1024:.1f} MiB")
    hwm, rss = (int(info[k].split()[0]) / 1024 for k in ("VmHWM", "VmRSS"))
    print(f"installer gate: opened the gate {opened:.2f} s after start "
          f"({cpu_open:.2f} CPU s); peak RSS {hwm:.1f} MiB, now {rss:.1f} MiB")
    print(f"installer gate idle {args.idle:g} s: {cpu_idle:.3f} CPU s "
          f"({100 * cpu_idle / args.idle:.3f}% of one core)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
