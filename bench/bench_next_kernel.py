"""The first run on a new kernel: with its modules prepared before the reboot versus
today's cold compile on the same kernel, side by side in one run.

Each host root is Debian 12 with two of Debian's kernels installed, 6.1.0-47 (the one the
install is for) and this machine's 6.1.0-56, both with their real headers; the fake .run is
served on 127.0.0.1, modules are built with real kbuild. Per round: host P runs `installer run`
for 6.1.0-47 with NVIDIA_INSTALLER_NEXT_KERNEL=run (6.1.0-56 prepared after the install), host C
with =off; then the "reboot": `installer run` for 6.1.0-56 on both, timed. Nothing is loaded
(the host roots' running kernel differs), so load, device nodes and verify are not in these
figures; the vm tier (tests/vm/test_next_kernel_vm.py) does the real reboot under TCG.

    python3 bench/bench_next_kernel.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import kit
from lib.hostkit import hidden_headers_argv, installer_argv, installer_env, make_debian_host
from lib.httpfaults import serve_directory
from lib.secondkernel import SECOND, add_headers, mark_installed

VERSION = "580.105.08"
STEP_DONE = re.compile(r"step (\S+): done in ([\d.]+) s")


def timed_run(env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run(hidden_headers_argv(installer_argv("run")), env=env,
                            capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(result.stderr[-3000:])
    return wall, result.stderr


def host(root: Path) -> str:
    nxt = make_debian_host(root)
    add_headers(root)
    for release in (SECOND, nxt):
        mark_installed(root, release)
    return nxt


def step_seconds(log: str, name: str) -> float:
    # The last one: the prepared kernel's own build-modules runs inside prepare-next-kernel.
    found = [float(s) for n, s in STEP_DONE.findall(log) if n == name]
    return found[-1] if found else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-next-kernel-", dir="/var/tmp"))
    www = work / "www"
    kit.build_runfile(VERSION, www / VERSION)
    cold: list[float] = []
    prepared: list[float] = []
    preparing: list[float] = []
    cold_build: list[float] = []
    with serve_directory(www) as (base, _requests):
        common = {"NVIDIA_DRIVER_VERSION": VERSION, "NVIDIA_DRIVER_MIRRORS": base,
                  "NVIDIA_DRIVER_DIGESTS_FILE": str(kit.write_digests(work / "digests", www))}
        for n in range(args.runs):  # alternate, so load changes hit both alike
            root_p, root_c = work / f"prepared{n}", work / f"cold{n}"
            nxt = host(root_p)
            host(root_c)
            _, log = timed_run(installer_env(root_p, SECOND, **common))
            preparing.append(step_seconds(log, "prepare-next-kernel"))
            timed_run(installer_env(root_c, SECOND, **common, NVIDIA_INSTALLER_NEXT_KERNEL="off"))
            wall, log = timed_run(installer_env(root_c, nxt, **common))
            cold.append(wall)
            cold_build.append(step_seconds(log, "build-modules"))
            wall, log = timed_run(installer_env(root_p, nxt, **common))
            assert "step build-modules: already satisfied" in log, log[-2000:]
            prepared.append(wall)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs")
    print(f"| first run on {nxt} | median s | runs (s) |")
    print("|---|---|---|")
    for label, values in ((f"cold: compiles (build-modules {statistics.median(cold_build):.2f} s)",
                           cold),
                          ("prepared before the reboot", prepared),
                          (f"(cost on {SECOND}: prepare-next-kernel, after ready)", preparing)):
        print(f"| {label} | {statistics.median(values):.2f} | "
              f"{', '.join(f'{v:.2f}' for v in values)} |")


if __name__ == "__main__":
    main()
