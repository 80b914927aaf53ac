"""What the installer's imports cost, in one tree or two side by side (a baseline checkout and
this one), alternating runs so both see the same machine load.

Per run: `python3 -X importtime -m installer --help` (the CLI alone) and `python3 -X importtime
-c "import installer.app"` (everything `installer run` imports before it starts). Reports the
cumulative import time of `installer.cli` and `installer.app` (median and minimum over the
runs) and the process's CPU seconds (user + system, less sensitive to other work than wall).

    python3 bench/bench_imports.py [--runs 15] [--baseline /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
COMMANDS = {
    "installer --help": ["-m", "installer", "--help"],
    "import installer.app": ["-c", "import installer.app"],
}
MEASURED = {"installer --help": "installer.cli", "import installer.app": "installer.app"}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(tree: Path, args: list[str], module: str) -> tuple[float, float]:
    """(cumulative import seconds of `module`, process CPU seconds)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cpu = _children_cpu()
    result = subprocess.run([sys.executable, "-X", "importtime", *args], env=env, cwd=tree,
                            capture_output=True, text=True, check=True)
    cpu = _children_cpu() - cpu
    for line in result.stderr.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if line.startswith("import time:") and len(fields) == 3 and fields[2] == module:
            return int(fields[1]) / 1e6, cpu
    raise RuntimeError(f"{module} not in the import trace of {tree}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    args = parser.parse_args()
    trees = {"this tree": HERE}
    if args.baseline:
        trees = {"baseline": args.baseline.resolve(), **trees}
    for tree in trees.values():  # bytecode caches written before anything is measured
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "installer")],
                       check=True)
        for name, command in COMMANDS.items():
            run_once(tree, command, MEASURED[name])
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.runs):
        for label, tree in trees.items():
            for name, command in COMMANDS.items():
                results.setdefault((label, name), []).append(
                    run_once(tree, command, MEASURED[name]))
    print(f"{'tree':<11}{'command':<22}{'import median':>14}{'min':>8}{'cpu median':>12}"
          f"{'min':>8}   (seconds, {args.runs} runs each)")
    for (label, name), runs in results.items():
        imports = [r[0] for r in runs]
        cpu = [r[1] for r in runs]
        print(f"{label:<11}{name:<22}{statistics.median(imports):>14.3f}{min(imports):>8.3f}"
              f"{statistics.median(cpu):>12.3f}{min(cpu):>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
