"""A fleet rollout, measured: N simulated GPU nodes registered with a real control plane
(tests/lib/controlplane.py, with the replicaset controller so evicted pods are replaced), GPU
workloads on them (ReplicaSets of pods requesting nvidia.com/gpu, placed by the real
kube-scheduler, run by one node agent for all nodes, each ReplicaSet held by a PDB with
maxUnavailable 1), and a driver version change rolled out under the shipped settings:

- as the DaemonSet controller's RollingUpdate with the shipped maxUnavailable (10% of the nodes,
  rounded up, as the DaemonSet controller rounds) would: at most that many nodes act at once,
  the next starting when one finishes;
- each acting node is its own process (bench/fleet_node.py) running the installer's real
  upgrade-protocol code with the shipped defaults (eviction and holders timeouts, pause
  components, poll interval), the shipped RBAC and admission policy enforced, its own token
  from the TokenRequest API bound to a Pod on its Node; the unload, build and load are a sleep
  of --install-seconds.

Every request of the installers goes through one ApiProxy (tests/lib/apiproxy.py) and is
counted per node by its token; the server's own apiserver_request_total (GET /metrics as the
administrator) is sampled for its peak request rate, whoever asked (the controllers, the
scheduler and the node agent included). At each node's unload its pods are listed: a GPU pod
still there is a violation.

    python3 bench/bench_fleet_rollout.py --nodes 50 [--nodes 200 --nodes 500]
        [--install-seconds 20] [--max-processes K] [--deadline 1800]

Each N gets a control plane of its own (a few seconds to start). Prints a table and a section
for bench/RESULTS.md (also written to --section when given).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import platform
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from lib import controlplane  # noqa: E402
from lib.apiproxy import ApiProxy  # noqa: E402
from lib.controlplane import ControlPlane  # noqa: E402
from lib.nodeagent import RENEW_SECONDS, NodeAgent  # noqa: E402
from lib.realcluster import RealNodes, apply_policies  # noqa: E402

PROTOCOL = REPO / "daemonset" / "components" / "upgrade-protocol"
DAEMONSET = REPO / "daemonset" / "base" / "daemonset.yaml"
NODE_SCRIPT = Path(__file__).resolve().parent / "fleet_node.py"
NAMESPACE = "gpu-work"
OLD, NEW = "580.105.08", "580.126.20"
# What the GPU operator's components select on: the installer pauses them by these labels.
DEPLOY_LABELS = {f"nvidia.com/gpu.deploy.{c}": "true"
                 for c in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm")}
CONTROLLERS = ("replicaset-controller",)


def shipped_max_unavailable(nodes: int) -> int:
    """The DaemonSet's RollingUpdate maxUnavailable as shipped, for `nodes` nodes: a percentage
    is rounded up (the DaemonSet controller's rounding), at least 1."""
    for doc in yaml.safe_load_all(DAEMONSET.read_text()):
        if doc and doc.get("kind") == "DaemonSet":
            value = doc["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"]
            if isinstance(value, str) and value.endswith("%"):
                return max(1, math.ceil(nodes * int(value[:-1]) / 100))
            return max(1, int(value))
    raise SystemExit(f"no DaemonSet in {DAEMONSET}")


class MetricsSampler:
    """apiserver_request_total summed over its labels, every `every` seconds, as the
    administrator (each sample is one request of its own, counted in the next)."""

    LINE = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$', re.M)

    def __init__(self, cp: ControlPlane, every: float) -> None:
        self.cp, self.every = cp, every
        self.samples: list[tuple[float, float, float]] = []  # (time, all, leases)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)
        self._context = ssl.create_default_context(cafile=str(cp.ca))
        self._context.load_cert_chain(cp.dir / "admin.crt", cp.dir / "admin.key")

    def sample(self) -> None:
        with urllib.request.urlopen(self.cp.url + "/metrics", context=self._context,
                                    timeout=30) as answer:
            text = answer.read().decode()
        total = leases = 0.0
        for labels, value in self.LINE.findall(text):
            total += float(value)
            if 'resource="leases"' in labels:
                leases += float(value)
        self.samples.append((time.monotonic(), total, leases))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            with contextlib.suppress(OSError):
                self.sample()

    def __enter__(self) -> MetricsSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.sample()

    def peak(self, column: int) -> float:
        rates = [(b[column] - a[column]) / (b[0] - a[0])
                 for a, b in zip(self.samples, self.samples[1:]) if b[0] > a[0]]
        return max(rates, default=0.0)

    def total(self, column: int) -> float:
        return self.samples[-1][column] - self.samples[0][column] if self.samples else 0.0


@dataclass
class Fleet:
    cp: ControlPlane
    nodes: list[str]
    workloads: int
    replicas: int
    tokens: dict[str, str] = field(default_factory=dict)


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _parallel(work: Any, items: list[Any], threads: int = 8) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(work, items))


def register_nodes(cp: ControlPlane, count: int, gpus: int) -> list[str]:
    """N Nodes as a kubelet registers them, each with `gpus` nvidia.com/gpu allocatable and the
    GPU operator's deploy labels."""
    names = [f"gpu-node-{i:04d}" for i in range(count)]

    def one(name: str) -> None:
        cp.node(name, labels=DEPLOY_LABELS)
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        cp.request("PATCH", f"/api/v1/nodes/{name}/status",
                   {"status": {"capacity": resources, "allocatable": resources}},
                   content_type="application/strategic-merge-patch+json")
        # The API server's TaintNodesByCondition gives a new Node node.kubernetes.io/not-ready;
        # the node lifecycle controller (not run here: no kubelets) would lift it once Ready.
        cp.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}},
                   content_type="application/merge-patch+json")

    _parallel(one, names)
    return names


def start_workloads(cp: ControlPlane, workloads: int, replicas: int, gpus_per_pod: int) -> None:
    cp.namespace(NAMESPACE)
    for w in range(workloads):
        name = f"train-{w:03d}"
        labels = {"app": name}
        cp.create(f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets", {
            "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "containers": [{"name": "main", "image": "cuda",
                                         "resources": {"limits": {
                                             "nvidia.com/gpu": str(gpus_per_pod)}}}]}}}})
        cp.create(f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets", {
            "metadata": {"name": name},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}})


def workloads_settled(cp: ControlPlane, workloads: int, replicas: int) -> tuple[int, int]:
    """(GPU pods Running and bound, PDBs whose status says all healthy, one disruption
    allowed)."""
    pods = cp.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running"
                  and "deletionTimestamp" not in p["metadata"])
    pdbs = cp.get(f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets")["items"]
    settled = sum(1 for b in pdbs if (b.get("status") or {}).get("currentHealthy") == replicas
                  and (b.get("status") or {}).get("disruptionsAllowed") == 1)
    return running, settled


def wait_settled(cp: ControlPlane, workloads: int, replicas: int, timeout: float) -> float:
    began = time.monotonic()
    while True:
        running, settled = workloads_settled(cp, workloads, replicas)
        if running == workloads * replicas and settled == workloads:
            return time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise SystemExit(f"the workloads never settled: {running} of "
                             f"{workloads * replicas} pods Running, {settled} of {workloads} "
                             "PDBs healthy")
        time.sleep(1.0)


class FleetAgent(NodeAgent):
    """The node agent for the whole fleet, its Lease renewals (every RENEW_SECONDS per node, as
    kubelets renew them) moved to a thread of their own with a few connections at once: the
    agent renews all its nodes' Leases in one round before it tends the pods, and 500 renewals
    in a row (about 10 ms each here) would hold the pods' start and deletion back by seconds
    every round, the rollout's drains with them."""

    def __init__(self, cp: ControlPlane, nodes: set[str], *, poll: float,
                 leases: bool = True) -> None:
        super().__init__(cp, nodes, poll=poll)
        self.leases = leases
        self.round_seconds: list[float] = []
        self._leases = threading.Thread(target=self._renew_all, name="leases", daemon=True)

    def __enter__(self) -> FleetAgent:
        super().__enter__()
        if self.leases:
            self._leases.start()
        return self

    def _renew(self, node: str) -> None:  # the agent's own round: the thread below does it
        return None

    def _renew_all(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    list(pool.map(lambda node: NodeAgent._renew(self, node), sorted(self.nodes)))
                except (controlplane.ApiError, OSError) as e:
                    self.errors.append(str(e))
                self.round_seconds.append(time.monotonic() - began)
                self._stop.wait(max(0.0, RENEW_SECONDS - (time.monotonic() - began)))


@dataclass
class NodeRun:
    node: str
    spawned: float
    proc: subprocess.Popen[str]
    result: dict[str, Any] | None = None


def roll_out(fleet: Fleet, proxy: ApiProxy, work: Path, concurrency: int,
             install_seconds: float, deadline: float) -> tuple[float, list[NodeRun]]:
    """The rolling update: at most `concurrency` node processes at once, the next node as soon
    as one ends. Returns the start time and every node's run."""
    queue = list(fleet.nodes)
    running: list[NodeRun] = []
    done: list[NodeRun] = []
    began = time.monotonic()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    while queue or running:
        while queue and len(running) < concurrency:
            node = queue.pop(0)
            kubeconfig = proxy.kubeconfig(work / f"{node}.kubeconfig", fleet.tokens[node])
            args = {"node": node, "kubeconfig": str(kubeconfig), "root": str(work / node),
                    "install_seconds": install_seconds, "old": OLD, "new": NEW,
                    "server": fleet.cp.url, "ca": str(fleet.cp.ca),
                    "admin_cert": str(fleet.cp.dir / "admin.crt"),
                    "admin_key": str(fleet.cp.dir / "admin.key")}
            log = open(work / f"{node}.log", "w")  # noqa: SIM115 - the child keeps it
            proc = subprocess.Popen([sys.executable, str(NODE_SCRIPT), json.dumps(args)],
                                    stdout=subprocess.PIPE, stderr=log, text=True, env=env)
            log.close()
            running.append(NodeRun(node, time.monotonic(), proc))
        time.sleep(0.1)
        for run in list(running):
            if run.proc.poll() is None:
                continue
            out = run.proc.stdout.read() if run.proc.stdout else ""
            with contextlib.suppress(ValueError):
                run.result = json.loads(out.strip().splitlines()[-1])
            running.remove(run)
            done.append(run)
        if time.monotonic() - began > deadline:
            for run in running:  # our own children, by their pids
                run.proc.kill()
                run.proc.wait()
                done.append(run)
            print(f"deadline of {deadline:g} s reached: {len(queue)} nodes never started, "
                  f"{len(running)} killed", file=sys.stderr)
            break
    return began, done


def progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    budget = shipped_max_unavailable(n)
    concurrency = min(budget, args.max_processes or budget)
    workloads = max(1, math.ceil(n * args.gpu_pods_per_node / args.replicas))
    setup_began = time.monotonic()
    cp = controlplane.start(extra_controllers=CONTROLLERS)
    work = Path(tempfile.mkdtemp(prefix=f"fleet-{n}-"))
    try:
        # The shipped RBAC and policies, bound to the shipped account, as the component applies
        # them.
        for manifest in ("rbac.yaml",):
            done = cp.apply("apply", "--server-side", "-f", str(PROTOCOL / manifest))
            assert done.returncode == 0, done.stderr
        apply_policies(cp, PROTOCOL / "admission-policy.yaml")
        cp.service_account(controlplane.NAMESPACE_OF_INSTALLER, controlplane.INSTALLER_ACCOUNT)
        RealNodes(cp, controlplane.INSTALLER_ACCOUNT).wait_allowed("list", "pods")
        progress(f"N={n}: control plane up, shipped RBAC and policy applied")
        nodes = register_nodes(cp, n, args.gpus_per_node)
        fleet = Fleet(cp, nodes, workloads, args.replicas)
        progress(f"N={n}: nodes registered")
        with FleetAgent(cp, set(nodes), poll=args.agent_poll,
                        leases=not args.no_leases) as agent:
            start_workloads(cp, workloads, args.replicas, args.gpus_per_pod)
            settle = wait_settled(cp, workloads, args.replicas, args.deadline)
            progress(f"N={n}: {workloads * args.replicas} GPU pods Running, {workloads} PDBs "
                     f"settled in {settle:.0f} s")
            fleet.tokens = dict(zip(nodes, _parallel(cp.pod_token, nodes)))
            progress(f"N={n}: tokens made; rolling out, {concurrency} nodes at once")
            proxy = ApiProxy(cp, work / "proxy-tls")
            with proxy:
                setup = time.monotonic() - setup_began
                load_before = os.getloadavg()
                cpu_before = {name: _cpu_seconds(p.pid) for name, p in cp.procs.items()}
                self_before = time.process_time()
                with MetricsSampler(cp, args.metrics_every) as sampler:
                    began, runs = roll_out(fleet, proxy, work, concurrency,
                                           args.install_seconds, args.deadline)
                    ended = time.monotonic()
                cpu = {name: _cpu_seconds(p.pid) - cpu_before[name]
                       for name, p in cp.procs.items()}
                cpu["bench (proxy, node agent, sampler)"] = time.process_time() - self_before
                restored = wait_settled(cp, workloads, args.replicas, 120.0)
            agent_errors = list(agent.errors)
            lease_round = max(agent.round_seconds, default=0.0)
        stored = cp.get("/api/v1/nodes")["items"]
        return summarize(n, args, budget, concurrency, workloads, fleet, proxy, sampler, runs,
                         began, ended, stored, cpu, load_before, setup, settle, restored,
                         lease_round, agent_errors, work)
    finally:
        cp.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


def summarize(n: int, args: argparse.Namespace, budget: int, concurrency: int, workloads: int,
              fleet: Fleet, proxy: ApiProxy, sampler: MetricsSampler, runs: list[NodeRun],
              began: float, ended: float, stored: list[dict[str, Any]], cpu: dict[str, float],
              load_before: tuple[float, float, float], setup: float, settle: float,
              restored: float, lease_round: float, agent_errors: list[str],
              work: Path) -> dict[str, Any]:
    results = [r.result for r in runs if r.result is not None]
    errors = [f"{r['node']}: {r['error']}" for r in results if r["error"]]
    errors += [f"{r.node}: exited {r.proc.returncode} with no result (log {work}/{r.node}.log)"
               for r in runs if r.result is None]
    violations = [f"{r['node']}: {pod}" for r in results for pod in r["gpu_pods_at_unload"]]
    loaded = [r["times"]["loaded"] for r in results if "loaded" in r["times"]]
    finished = [r["times"]["finished"] for r in results if "finished" in r["times"]]
    new_driver = sum(1 for node in fleet.nodes
                     if (work / node / "driver-version").is_file()
                     and (work / node / "driver-version").read_text().strip() == NEW)
    left_cordoned = [o["metadata"]["name"] for o in stored
                     if (o.get("spec") or {}).get("unschedulable")
                     or "nvidia-driver-installer/upgrade" in (o["metadata"].get("annotations")
                                                              or {})]
    # The proxy's record keeps each request's token: a node's requests are its token's.
    by_token: dict[str | None, list[tuple[float, int, int]]] = {}
    with proxy.lock:
        for seen in proxy.seen:
            by_token.setdefault(seen.bearer, []).append((seen.at, seen.bytes_in, seen.bytes_out))
    per_node = [by_token.get(fleet.tokens[node], []) for node in fleet.nodes]
    requests = [len(calls) for calls in per_node]
    sent = [sum(c[1] for c in calls) for calls in per_node]
    received = [sum(c[2] for c in calls) for calls in per_node]
    installer_seconds: dict[int, int] = {}
    for calls in per_node:
        for at, _, _ in calls:
            installer_seconds[int(at - began)] = installer_seconds.get(int(at - began), 0) + 1
    drains = [r["times"]["room_made"] - r["times"]["imported"] for r in results
              if "room_made" in r["times"]]
    spawn = {r.node: r.spawned for r in runs}
    starts = [r["times"]["imported"] - spawn[r["node"]] for r in results]
    rss = [r.get("peak_rss_mib", 0.0) for r in results]
    child_cpu = [r.get("cpu_seconds", 0.0) for r in results]
    return {
        "nodes": n, "budget": budget, "concurrency": concurrency, "workloads": workloads,
        "gpu_pods": workloads * args.replicas, "install_seconds": args.install_seconds,
        "load_before": load_before, "setup_seconds": setup, "settle_seconds": settle,
        "lease_round_seconds": lease_round,
        "wall_until_new_driver": (max(loaded) - began) if len(loaded) == n else None,
        "wall_until_restored": (max(finished) - began) if len(finished) == n else None,
        "wall": ended - began, "nodes_on_new_driver": new_driver,
        "requests_per_node": (sum(requests) / n, percentile(requests, 0.5), max(requests)),
        "bytes_sent_per_node": sum(sent) / n, "bytes_received_per_node": sum(received) / n,
        "installer_peak_rps": max(installer_seconds.values(), default=0),
        "server_peak_rps": sampler.peak(1),
        "server_peak_rps_without_leases": max(
            ((b[1] - b[2] - a[1] + a[2]) / (b[0] - a[0])
             for a, b in zip(sampler.samples, sampler.samples[1:]) if b[0] > a[0]),
            default=0.0),
        "server_requests": sampler.total(1), "server_lease_requests": sampler.total(2),
        "drain_seconds": (percentile(drains, 0.5), max(drains, default=0.0)),
        # What the rollout would take bounded by its budget and the per-node time alone: the
        # rounds of `concurrency` nodes, each the install time and a median drain.
        "bound_seconds": math.ceil(n / concurrency) * (args.install_seconds
                                                      + percentile(drains, 0.5)),
        "process_start_seconds": (percentile(starts, 0.5), max(starts, default=0.0)),
        "process_peak_rss_mib": max(rss, default=0.0),
        "process_cpu_seconds": percentile(child_cpu, 0.5),
        "cpu_seconds": cpu, "violations": violations, "errors": errors,
        "left_cordoned": left_cordoned, "restored_seconds": restored,
        "agent_errors": len(agent_errors),
    }


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| N | acting at once (budget) | GPU pods / PDBs | wall until all on the new driver "
             "s | rounds x (install + median drain) s | until all restored s | requests per "
             "node mean / median / max | bytes per node sent / received | installers' peak "
             "req/s | server's peak req/s (without Leases) | drain per node median / max s | "
             "GPU pods at an unload | failed nodes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mean, median, most = r["requests_per_node"]
        lines.append(
            f"| {r['nodes']} | {r['concurrency']} ({r['budget']}) | {r['gpu_pods']} / "
            f"{r['workloads']} | {_fmt(r['wall_until_new_driver'])} | "
            f"{r['bound_seconds']:.1f} | "
            f"{_fmt(r['wall_until_restored'])} | {mean:.1f} / {median} / {most} | "
            f"{r['bytes_sent_per_node'] / 1024:.1f} KiB / "
            f"{r['bytes_received_per_node'] / 1024:.1f} KiB | {r['installer_peak_rps']} | "
            f"{r['server_peak_rps']:.0f} ({r['server_peak_rps_without_leases']:.0f}) | "
            f"{r['drain_seconds'][0]:.1f} / {r['drain_seconds'][1]:.1f} | "
            f"{len(r['violations'])} | {len(r['errors'])} |")
    return "\n".join(lines)


def details(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in r["cpu_seconds"].items())
        lines.append(
            f"- N={r['nodes']}: setup {r['setup_seconds']:.0f} s (workloads settled in "
            f"{r['settle_seconds']:.0f} s; the slowest round of {r['nodes']} Lease renewals "
            f"{r['lease_round_seconds']:.1f} s, made every {RENEW_SECONDS} s); "
            f"{r['nodes_on_new_driver']} of {r['nodes']} nodes on {NEW}, "
            f"{len(r['left_cordoned'])} left cordoned or annotated; server requests during the "
            f"rollout {r['server_requests']:.0f} ({r['server_lease_requests']:.0f} Lease "
            f"renewals); a node's process: start to imports {r['process_start_seconds'][0]:.2f}"
            f" s median ({r['process_start_seconds'][1]:.2f} max), peak RSS "
            f"{r['process_peak_rss_mib']:.0f} MiB, {r['process_cpu_seconds']:.2f} CPU s; CPU "
            f"seconds during the rollout: {cpu}; load average before "
            f"{r['load_before'][0]:.2f} {r['load_before'][1]:.2f} {r['load_before'][2]:.2f}; "
            f"workloads settled again {r['restored_seconds']:.0f} s after the last node; "
            f"node agent errors {r['agent_errors']}.")
        for what in ("violations", "errors"):
            for line in r[what][:5]:
                lines.append(f"  - {what[:-1]}: {line}")
    return "\n".join(lines)


def section(rows: list[dict[str, Any]], command: str) -> str:
    date = time.strftime("%Y-%m-%d", time.gmtime())
    return (f"## A fleet rollout of the upgrade protocol, measured ({date})\n\n"
            f"Command: `{command}`\n"
            f"Machine: {platform.platform()}, {os.cpu_count()} CPUs, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, Python "
            f"{platform.python_version()}; Kubernetes from `scripts/control-plane`.\n\n"
            f"{table(rows)}\n\n{details(rows)}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, action="append",
                        help="fleet size (repeat for several; default 50)")
    parser.add_argument("--install-seconds", type=float, default=20.0,
                        help="the stubbed unload, build and load per node")
    parser.add_argument("--max-processes", type=int, default=0,
                        help="cap on node processes at once (default: the shipped budget)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gpus-per-pod", type=int, default=4)
    parser.add_argument("--gpu-pods-per-node", type=float, default=1.0,
                        help="GPU pods per node on average (capacity left for replacements)")
    parser.add_argument("--replicas", type=int, default=10,
                        help="pods per ReplicaSet (each ReplicaSet has a PDB, maxUnavailable 1)")
    parser.add_argument("--agent-poll", type=float, default=1.0,
                        help="seconds between the node agent's passes over the pods")
    parser.add_argument("--no-leases", action="store_true",
                        help="renew no node Leases (nothing here reads them; a real fleet's "
                        "kubelets renew one per node every 10 s)")
    parser.add_argument("--metrics-every", type=float, default=2.0)
    parser.add_argument("--deadline", type=float, default=1800.0,
                        help="seconds a rollout (and the workloads' start) may take")
    parser.add_argument("--section", type=Path, help="also write the RESULTS.md section here")
    parser.add_argument("--keep", action="store_true", help="keep the nodes' logs")
    args = parser.parse_args()
    reason = controlplane.missing()
    if reason is not None:
        raise SystemExit(reason)
    rows = []
    for n in args.nodes or [50]:
        row = measure(n, args)
        rows.append(row)
        print(table([row]), flush=True)
    command = "python3 bench/bench_fleet_rollout.py " + " ".join(sys.argv[1:])
    text = section(rows, command.strip())
    print("\n" + text)
    if args.section is not None:
        args.section.write_text(text)
    failed = any(r["violations"] or r["errors"] or r["wall_until_restored"] is None
                 for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
