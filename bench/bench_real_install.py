"""A cold install of NVIDIA's real 535.261.03 driver, phase by phase, and the same node with the
modules pulled from a registry instead of compiled.

    python3 bench/bench_real_install.py [--size-mb 330]

The .run is the kit's, built from NVIDIA's real parts (kit.real_parts: Debian's packages, fetched
by scripts/install-deps), padded with random bytes to a real 535 driver's size (NVIDIA's
NVIDIA-Linux-x86_64-535.*.run is about 330 MB), served on 127.0.0.1 with its .sha256sum.
Node A: a Debian 12 host root with Debian's split 6.1.0-56 headers; `installer run` downloads,
extracts, compiles NVIDIA's proprietary modules (nvidia-installer stand-in, NVIDIA's Makefile)
and installs, building ahead (nothing is loaded). It publishes the modules to docker-registry
on 127.0.0.1. Node B: no headers; `installer run` with the registry pulls the modules instead of
compiling, and the user space node A published (signed, per version and architecture) instead of
the .run: the bytes the HTTP server sent for the .run are counted (0 is the goal). Phase times are
the installer's own `step X: done in N s` lines; peak RSS is the installer process's (and its
children's) ru_maxrss, measured in a wrapper process of its own. Node A signs what it publishes
(NVIDIA_MODULE_PUBLISHER_KEY), node B trusts that key (NVIDIA_MODULE_TRUSTED_KEYS). The compile
runs under `nice -n 10` (the machine is shared); the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kit import real_parts
from kit.builder import build_real_runfile
from kit.digests import write_digests
from lib.hostkit import hidden_headers_argv, installer_argv, installer_env, make_debian_host
from lib.registrykit import PASSWORD, USER, Registry, make_key_pair

STEP_DONE = re.compile(r"step (\S+): done in ([\d.]+) s")
PHASES = {
    "download": ("fetch-runfile",),
    "extract": ("extract-runfile",),
    "compile": ("build-modules",),
    "pull modules (registry)": ("use-prebuilt-modules",),
    "pull user space (registry)": ("pull-userspace",),
    "install": ("install-userspace", "install-module-files", "install-firmware",
                "activate-install", "configure-ld-cache", "record-install"),
    "publish modules (registry)": ("publish-modules",),
    "publish user space (registry)": ("publish-userspace",),
}
# Runs the installer as its only child and writes that child's peak RSS (KiB) to the fd argv[1].
RSS_WRAPPER = ("import os, resource, subprocess, sys\n"
               "code = subprocess.run(sys.argv[2:]).returncode\n"
               "os.write(int(sys.argv[1]),\n"
               "         str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss).encode())\n"
               "sys.exit(code)\n")


@contextlib.contextmanager
def counting_server(directory: Path) -> Iterator[tuple[str, dict[str, int]]]:
    """A static server for `directory` on 127.0.0.1 that counts the body bytes it sends per
    path (what a node downloaded, resumed or not)."""
    sent: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(directory), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def copyfile(self, source: Any, outputfile: Any) -> None:
            count = 0
            for block in iter(lambda: source.read(1 << 20), b""):
                outputfile.write(block)
                count += len(block)
            with lock:
                sent[self.path] = sent.get(self.path, 0) + count

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", sent
    finally:
        server.shutdown()
        server.server_close()


def timed_run(env: dict[str, str]) -> tuple[dict[str, float], float, float, int]:
    """Phase seconds, wall seconds, load average at the start, peak RSS in KiB."""
    load = os.getloadavg()[0]
    read, write = os.pipe()
    started = time.monotonic()
    argv = ["nice", "-n", "10", *hidden_headers_argv(installer_argv("run"))]
    result = subprocess.run([sys.executable, "-c", RSS_WRAPPER, str(write), *argv], env=env,
                            capture_output=True, text=True, check=False, pass_fds=(write,))
    wall = time.monotonic() - started
    os.close(write)
    with os.fdopen(read) as pipe:
        rss = int(pipe.read() or 0)
    if result.returncode != 0:
        sys.exit(f"installer run failed ({result.returncode}):\n{result.stderr[-4000:]}")
    steps = {name: float(sec) for name, sec in STEP_DONE.findall(result.stderr)}
    return ({phase: sum(steps.get(s, 0.0) for s in names) for phase, names in PHASES.items()},
            wall, load, rss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=330, help="the .run's size, MB")
    args = parser.parse_args()
    parts = real_parts.require()
    with tempfile.TemporaryDirectory(prefix="bench-real-", dir="/var/tmp") as scratch:
        work = Path(scratch)
        www = work / "www"
        run = build_real_runfile(www / real_parts.VERSION, parts, pad_to=args.size_mb * 10**6)
        size = run.stat().st_size
        private, public = make_key_pair(work / "keys")
        registry = Registry(work / "registry").start()
        try:
            with counting_server(www) as (base, sent):
                common = {
                    "NVIDIA_DRIVER_VERSION": real_parts.VERSION,
                    "NVIDIA_KERNEL_MODULE_TYPE": "proprietary",
                    "NVIDIA_DRIVER_MIRRORS": base,
                    "NVIDIA_DRIVER_DIGESTS_FILE": str(write_digests(work / "digests", www)),
                    "NVIDIA_MODULE_REGISTRY": registry.repository("bench/modules"),
                    "NVIDIA_MODULE_REGISTRY_PLAIN_HTTP": "true",
                    "NVIDIA_MODULE_REGISTRY_USERNAME": USER,
                    "NVIDIA_MODULE_REGISTRY_PASSWORD": PASSWORD,
                    "NVIDIA_MODULE_TRUSTED_KEYS": str(public),
                }
                node_a = work / "a"
                kernel = make_debian_host(node_a)
                a, a_wall, a_load, a_rss = timed_run(installer_env(
                    node_a, kernel, NVIDIA_MODULE_REGISTRY_PUSH="true",
                    NVIDIA_MODULE_PUBLISHER_KEY=str(private), **common))
                node_b = work / "b"
                make_debian_host(node_b, headers=False)
                a_sent = sum(n for path, n in sent.items() if ".run" in path)
                sent.clear()
                b, b_wall, b_load, b_rss = timed_run(installer_env(node_b, kernel, **common))
                b_sent = sum(n for path, n in sent.items() if ".run" in path)
        finally:
            registry.stop()
    print(f"NVIDIA-Linux-x86_64-{real_parts.VERSION}.run (the kit's, NVIDIA's real parts, "
          f"padded): {size / 1e6:.0f} MB; {os.cpu_count()} CPUs")
    print(f"load average at the start: node A {a_load:.2f}, node B {b_load:.2f}")
    print("| phase (s) | node A: compiles, publishes | node B: pulls modules and user space |")
    print("|---|---|---|")
    for phase in PHASES:
        print(f"| {phase} | {a[phase]:.1f} | {b[phase]:.1f} |")
    print(f"| **whole process (wall)** | **{a_wall:.1f}** | **{b_wall:.1f}** |")
    print(f"| bytes of the .run served | {a_sent} | {b_sent} |")
    print(f"| peak RSS (MiB) | {a_rss / 1024:.0f} | {b_rss / 1024:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
