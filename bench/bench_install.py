"""Cold install and warm re-run of `installer run` with the fake-driver kit, phase by phase.

Runs the real installer against a temporary host root (real Debian headers, real kbuild,
ldconfig, depmod; the driver built for the headers' kernel, so nothing is loaded here) and a
fake .run served on 127.0.0.1. Reports each phase's time from the installer's own step log and
the installer's overhead: its wall time minus external commands and the download; then the
process's wall time, the CPU seconds of it and its children, and the CPU seconds of the
installer's Python process alone (what the imports and the Python work cost, the figure that
other work on a busy machine disturbs least); beside each warm run, a bare `python3 -c pass`
(plain and inside the same private mounts), so the ratio is measured under one load.

    python3 bench/bench_install.py [--warm-runs 5]

Loading, device nodes and verification need a kernel: `pytest -m vm tests/vm` covers them
(under TCG emulation, so their times there are not comparable).
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import kit
from lib.hostkit import REPO, hidden_headers_argv, installer_env, make_debian_host
from lib.httpfaults import serve_directory

VERSION = "580.105.08"
STEP_DONE = re.compile(r"step (\S+): done in ([\d.]+) s")
TOTAL = re.compile(r"done in ([\d.]+) s \(([\d.]+) s in external commands\)")
PHASES = {
    "download": ("fetch-runfile",),
    "extract": ("extract-runfile",),
    "build": ("build-modules",),
    "install": ("install-userspace", "activate-install", "install-module-files",
                "configure-ld-cache", "record-install"),
}


# `python -m installer run`, reporting on stdout the CPU seconds of the installer's own Python
# process (imports and its work, not the commands it runs): on a busy machine the steadiest
# measure of what the Python side costs.
RUN_AND_REPORT_CPU = """
import os, runpy, sys, time
started = time.process_time()
sys.argv = ["installer", "run"]
try:
    runpy.run_module("installer", run_name="__main__", alter_sys=True)
except SystemExit as done:
    if done.code:
        raise
os.write(1, b"%.4f\\n" % (time.process_time() - started))
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(env: dict[str, str]) -> dict[str, float]:
    cpu = _children_cpu()
    started = time.monotonic()
    result = subprocess.run(hidden_headers_argv([sys.executable, "-c", RUN_AND_REPORT_CPU]),
                            env=env, capture_output=True, text=True, check=True)
    wall = time.monotonic() - started
    cpu = _children_cpu() - cpu
    steps = {name: float(sec) for name, sec in STEP_DONE.findall(result.stderr)}
    total = TOTAL.search(result.stderr)
    assert total, result.stderr[-2000:]
    figures = {phase: sum(steps.get(s, 0.0) for s in names) for phase, names in PHASES.items()}
    figures["installer total"] = float(total.group(1))
    figures["process wall"] = wall
    # CPU seconds of the process and its children (unshare, sh, the commands it runs): far
    # less sensitive than wall time to other work on a busy machine.
    figures["process cpu"] = cpu
    figures["python cpu"] = float(result.stdout.strip().splitlines()[-1])
    figures["overhead"] = float(total.group(1)) - float(total.group(2)) - figures["download"]
    return figures


def bare_interpreter(env: dict[str, str], wrapped: bool) -> float:
    """Wall seconds of `python3 -c pass` with the run's environment: the floor a warm run stands
    on (`wrapped`: inside the same private mounts the installer runs in)."""
    argv = [sys.executable, "-c", "pass"]
    started = time.monotonic()
    subprocess.run(hidden_headers_argv(argv) if wrapped else argv, env=env, check=True)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--warm-runs", type=int, default=5)
    args = parser.parse_args()
    # As in the images (pip compiles on install): bytecode is there before anything is timed,
    # also where PYTHONDONTWRITEBYTECODE keeps the runs from writing it.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "installer")],
                   check=True)
    with tempfile.TemporaryDirectory(prefix="bench-install-") as scratch:
        www = Path(scratch) / "www"
        kit.build_runfile(VERSION, www / VERSION)
        root = Path(scratch) / "host"
        kernel = make_debian_host(root)
        with serve_directory(www) as (base, _):
            env = installer_env(root, kernel, NVIDIA_DRIVER_VERSION=VERSION,
                                NVIDIA_DRIVER_MIRRORS=base, NVIDIA_DRIVER_DIGESTS_FILE=str(
                                    kit.write_digests(Path(scratch) / "digests", www)))
            cold = run_once(env)
            warm_runs, bare, bare_wrapped = [], [], []
            for _ in range(args.warm_runs):  # interleaved: each pair sees the same load
                warm_runs.append(run_once(env))
                bare.append(bare_interpreter(env, wrapped=False))
                bare_wrapped.append(bare_interpreter(env, wrapped=True))
    warm = {key: statistics.median(r[key] for r in warm_runs) for key in cold}
    print(f"{'phase (s)':<18}{'cold':>10}{'warm (median of ' + str(args.warm_runs) + ')':>24}")
    for key in cold:
        print(f"{key:<18}{cold[key]:>10.3f}{warm[key]:>24.3f}")
    floor, wrapped_floor = statistics.median(bare), statistics.median(bare_wrapped)
    print(f"{'python3 -c pass':<18}{'':>10}{floor:>24.3f}")
    print(f"{'  in the mounts':<18}{'':>10}{wrapped_floor:>24.3f}")
    print(f"warm run / bare interpreter: {warm['process wall'] / floor:.1f}x "
          f"({warm['process wall'] / wrapped_floor:.1f}x against the same mounts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
