"""`installer verify` with and without the CUDA check, on the fake-driver kit (two GPUs).

Builds the kit's .run, puts its nvidia-smi, NVML and libcuda in an install dir and a loaded
driver under the kit's test-only root, then times interleaved rounds of: verify as it was
before the CUDA check (nvidia-smi and the NVML child only), verify with it, and the CUDA child
alone. Prints medians and the load average, which on a shared machine says how far to trust
them. The warm path (`installer run` on an installed host) does not verify: see
bench_install.py and tests/integration/test_warm_path_imports.py.

    python3 bench/bench_verify.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's installer

import kit
from kit.fake_host import TEST_ROOT_ENV, FakeGpu, write_loaded_driver

from installer.runner import SubprocessRunner
from installer.verify import cuda, verify

VERSION = "580.105.08"
GPUS = [FakeGpu("0000:18:00.0", 0x2330, "NVIDIA H100 80GB HBM3", 0),
        FakeGpu("0000:2a:00.0", 0x2330, "NVIDIA H100 80GB HBM3", 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        install = kit.install_nvml(kit.extract_runfile(VERSION, Path(work)),
                                   Path(work) / "install", VERSION)
        root = Path(work) / "host"
        write_loaded_driver(root, VERSION, GPUS)
        runner = SubprocessRunner(base_env={**os.environ, TEST_ROOT_ENV: str(root)})
        expected = [g.address for g in GPUS]

        def run_verify() -> None:
            report = verify(install_dir=install, expected_version=VERSION,
                            expected_gpus=expected, runner=runner)
            assert report.ok, report.problems

        def before() -> None:
            with mock.patch.object(cuda, "query", lambda *a, **k: None):
                run_verify()

        def child() -> None:
            problems: list[str] = []
            env = {"LD_LIBRARY_PATH": str(install / "lib64")}
            assert cuda.query(env, runner, 60, str(Path(__file__).resolve().parents[1]),
                              problems) is not None, problems

        times: dict[str, list[float]] = {"verify before (smi + NVML)": [],
                                         "verify with the CUDA check": [],
                                         "the CUDA child alone": []}
        run_verify()  # warm the page cache
        for _ in range(args.rounds):  # interleaved: each round sees the same load
            for name, job in zip(times, (before, run_verify, child)):
                started = time.perf_counter()
                job()
                times[name].append(time.perf_counter() - started)
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"on {os.cpu_count()} CPUs; {args.rounds} rounds, medians (min..max) in seconds")
    for name, values in times.items():
        print(f"  {name:<30}{statistics.median(values):>8.3f}  "
              f"({min(values):.3f}..{max(values):.3f})")


if __name__ == "__main__":
    main()
