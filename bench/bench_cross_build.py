"""Cross-building NVIDIA's real arm64 535.261.03 modules on this x86 machine against a native x86
build of the same version and flavour, both with NVIDIA's Makefile as `installer prebuild`
drives it (`make SYSSRC= SYSOUT= modules`, nvidia-drm left out), against Debian's 6.1.0-47
headers of each architecture; prints a Markdown table row per build with the load average.

Run from the repository root after scripts/install-deps:
`python3 bench/bench_cross_build.py [--flavours open,proprietary] [--jobs N]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# This checkout's installer and kit, not an installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kit import arm64_parts, real_parts

from installer.sources.runfile import cross


def build(tree: Path, source: Path, output: Path, variables: dict[str, str], jobs: int
          ) -> tuple[float, int]:
    """Seconds and the total size of the .ko files of one build of `tree` (a fresh copy)."""
    with tempfile.TemporaryDirectory(prefix="bench-cross.") as scratch:
        copy = Path(scratch) / tree.name
        shutil.copytree(tree, copy, symlinks=True)
        argv = cross.make_argv(copy, str(source), str(output), variables, jobs)
        started = time.monotonic()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds = time.monotonic() - started
        return seconds, sum(p.stat().st_size for p in copy.glob("*.ko"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flavours", default="open,proprietary")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    native = real_parts.require()
    amd64 = real_parts.require_old_headers()
    arm64 = arm64_parts.require()
    common = amd64.root / "usr/src/linux-headers-6.1.0-47-common"
    arm64_common = arm64.headers_root / "usr/src/linux-headers-6.1.0-47-common"
    print("| flavour | build | seconds | .ko bytes | load average before |")
    print("|---|---|---|---|---|")
    for flavour in args.flavours.split(","):
        directory = "kernel-open" if flavour == "open" else "kernel"
        runs = [
            ("native x86_64 (gcc-12)", native.directory / directory, common, amd64.output,
             {"CC": "gcc-12"}),
            ("cross aarch64 (aarch64-linux-gnu-gcc-12)", arm64.directory / "parts" / directory,
             arm64_common, arm64.headers_root / f"usr/src/linux-headers-{arm64_parts.KERNEL}",
             cross._variables(cross.ARCHES["aarch64"], "aarch64-linux-gnu-gcc-12")),
        ]
        for name, tree, source, output, variables in runs:
            load = "/".join(f"{x:.1f}" for x in os.getloadavg())
            seconds, size = build(tree, source, output, variables, args.jobs)
            print(f"| {flavour} | {name} | {seconds:.0f} | {size} | {load} |", flush=True)


if __name__ == "__main__":
    main()
