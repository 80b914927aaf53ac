"""What idle clients cost the metrics container (`installer metrics`): its threads and RSS
before and after N clients that open a connection, send half a request and wait, whether a
scrape still answers then (and how fast), and the machine's load average. On 127.0.0.1 only,
bounded in count (at most 5,000 clients) and time (at most about 80 s per exporter).

Baseline in the same run: the exporter of `--baseline` (default d634eef, the last commit with
prometheus_client's own HTTP server: a thread per connection, no deadline, no cap), extracted
with `git archive` and started the same way on the same host root.

    python3 bench/bench_metrics_idle.py [--clients 2000] [--baseline d634eef]
"""

from __future__ import annotations

import argparse
import io
import os
import selectors
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # this tree's installer, not an installed one

from lib.hosttrees import make_host, root_env  # noqa: E402

PARTIAL = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # the blank line never comes
SETTLE = 40.0  # seconds at most for the thread count to stop growing
CONNECT = 20.0  # seconds for the clients to get their connections
BATCH, PAUSE = 20, 0.02  # connections opened at a time, seconds between (1,000 a second)


def _status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines()
                                      if ":" in line)}


def _threads_rss(pid: int) -> tuple[int, float]:
    status = _status(pid)
    return int(status["Threads"]), int(status["VmRSS"].split()[0]) / 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> tuple[str, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            answer.read()
            return str(answer.status), time.monotonic() - started
    except OSError as exc:
        return type(exc).__name__, time.monotonic() - started


def _open_idle(port: int, count: int, held: list[socket.socket]) -> int:
    """`count` connections, BATCH at a time (an accept queue that overflows would leave the
    rest in the kernel, not in the exporter), each sent half a request, non-blocking so a
    server slow to accept cannot stall the bench; how many got through within CONNECT s."""
    pending: set[socket.socket] = set()
    connected = 0
    deadline = time.monotonic() + CONNECT
    with selectors.DefaultSelector() as selector:

        def collect(wait: float) -> int:
            done = 0
            for key, _ in selector.select(timeout=wait):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                selector.unregister(sock)
                pending.discard(sock)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    try:
                        sock.send(PARTIAL)
                        done += 1
                    except OSError:
                        pass
            return done

        for start in range(0, count, BATCH):
            for _ in range(min(BATCH, count - start)):
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", port))
                held.append(sock)
                selector.register(sock, selectors.EVENT_WRITE)
                pending.add(sock)
            connected += collect(PAUSE)
            time.sleep(PAUSE)
        while pending and time.monotonic() < deadline:
            connected += collect(0.5)
    return connected


def _baseline_tree(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "installer"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(name: str, code: Path, env: dict[str, str], clients: int) -> dict[str, object]:
    port = _free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", "installer", "metrics", "--listen", f"127.0.0.1:{port}"],
        cwd=code, env={**env, "PYTHONPATH": str(code)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while _scrape(port)[0] != "200":
            if child.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name}: the exporter did not start")
            time.sleep(0.2)
        threads0, rss0 = _threads_rss(child.pid)
        connected = _open_idle(port, clients, held)
        # Until the exporter stops growing (a thread per connection takes a while to start).
        last, still = -1, time.monotonic()
        stop_at = time.monotonic() + SETTLE
        while time.monotonic() < stop_at:
            threads, _ = _threads_rss(child.pid)
            if threads != last:
                last, still = threads, time.monotonic()
            elif time.monotonic() - still > 5:
                break
            time.sleep(0.25)
        threads1, rss1 = _threads_rss(child.pid)
        load = os.getloadavg()[0]
        scrape, seconds = _scrape(port)
        return {"exporter": name, "clients connected": connected, "threads before": threads0,
                "threads after": threads1,
                "RSS before MB": round(rss0, 1), "RSS after MB": round(rss1, 1),
                "scrape": f"{scrape} in {seconds * 1000:.0f} ms", "load avg 1m": round(load, 2)}
    finally:
        for sock in held:
            sock.close()
        child.terminate()
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--baseline", default="d634eef")
    args = parser.parse_args()
    clients = max(1, min(args.clients, 5000))
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "host"
        make_host(root, distro="debian-12")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               **root_env(root, NVIDIA_INSTALL_DIR_HOST="/var/lib/nvidia")}
        baseline = _baseline_tree(args.baseline, Path(scratch) / "baseline")
        rows = [measure(f"baseline {args.baseline}", baseline, env, clients),
                measure("this tree", REPO, env, clients)]
    print(f"{clients} idle clients, each holding half a request; "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
