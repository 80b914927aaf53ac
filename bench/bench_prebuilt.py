"""Node B's cold install with a prebuilt-module artifact versus compiling, and the download
ratio to curl, side by side in one run.

Node A compiles and publishes to a real registry (Debian's docker-registry on 127.0.0.1); node
B (fresh host root, same kernel, no headers) pulls and verifies; node C (fresh, registry
unset) compiles. Same fake .run, same real headers, real kbuild/ldconfig/depmod; nothing is
loaded (the host root's running kernel differs). Then bench_download's curl comparison.

    python3 bench/bench_prebuilt.py [--runs 3] [--download-mib 512]
"""

from __future__ import annotations

import argparse
import os
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
from lib.registrykit import PASSWORD, USER, Registry, make_key_pair

HERE = Path(__file__).resolve().parent
VERSION = "580.105.08"


def timed_run(env: dict[str, str]) -> float:
    started = time.monotonic()
    result = subprocess.run(hidden_headers_argv(installer_argv("run")), env=env,
                            capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(result.stderr[-3000:])
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--download-mib", type=int, default=512)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-prebuilt-", dir="/var/tmp"))
    www = work / "www"
    kit.build_runfile(VERSION, www / VERSION)
    registry = Registry(work / "registry").start()
    private, public = make_key_pair(work / "keys")
    compiled: list[float] = []
    pulled: list[float] = []
    try:
        with serve_directory(www) as (base, _requests):
            repo = registry.repository("bench/nvidia-modules")
            common = {"NVIDIA_DRIVER_VERSION": VERSION, "NVIDIA_DRIVER_MIRRORS": base,
                      "NVIDIA_DRIVER_DIGESTS_FILE": str(kit.write_digests(work / "digests", www))}
            reg = {"NVIDIA_MODULE_REGISTRY": repo, "NVIDIA_MODULE_REGISTRY_PLAIN_HTTP": "true",
                   "NVIDIA_MODULE_REGISTRY_USERNAME": USER,
                   "NVIDIA_MODULE_REGISTRY_PASSWORD": PASSWORD,
                   "NVIDIA_MODULE_TRUSTED_KEYS": str(public)}
            root_a = work / "node-a"
            kernel = make_debian_host(root_a)
            timed_run(installer_env(root_a, kernel, **common, **reg,
                                    NVIDIA_MODULE_REGISTRY_PUSH="true",
                                    NVIDIA_MODULE_PUBLISHER_KEY=str(private)))
            for n in range(args.runs):  # alternate, so load changes hit both alike
                root_c = work / f"node-c{n}"
                make_debian_host(root_c)
                compiled.append(timed_run(installer_env(root_c, kernel, **common)))
                root_b = work / f"node-b{n}"
                make_debian_host(root_b, headers=False)
                pulled.append(timed_run(installer_env(root_b, kernel, **common, **reg)))
    finally:
        registry.stop()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs")
    print("| node B cold install | median s | runs (s) |")
    print("|---|---|---|")
    print(f"| compiling | {statistics.median(compiled):.2f} | "
          f"{', '.join(f'{s:.2f}' for s in compiled)} |")
    print(f"| prebuilt artifact | {statistics.median(pulled):.2f} | "
          f"{', '.join(f'{s:.2f}' for s in pulled)} |")
    print()
    subprocess.run([sys.executable, str(HERE / "bench_download.py"), "--sizes",
                    str(args.download_mib), "--runs", str(args.runs)], check=True)


if __name__ == "__main__":
    main()
