"""What the installer's imports cost, in one tree or two side by side (a baseline checkout and
this one), alternating runs so both see the same machine load.

Per run: `python3 -X importtime -m installer --help` (the CLI alone) and `python3 -X importtime
-c "import installer.app"` (everything `installer run` imports before it starts). Reports the
cumulative import time of `installer.cli` and `installer.app` (median and minimum over the
runs) and the process's CPU seconds (user + system, less sensitive to other work than wall).

    python3 bench/bench_imports.py [--runs 15] [--baseline /path/to/other/checkout]

Then, for each tree, where `import installer.app`'s CPU goes: the share spent creating
dataclasses (dataclasses generate and compile each class's methods at import) and compiling
regular expressions, measured by timing those two stdlib functions in a child process.
"""

from __future__ import annotations

import argparse
import json
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


# Run in a child: CPU of `import installer.app`, and of the dataclass and regex set-up in it.
WHERE_PROBE = """
import dataclasses, json, re, time
spent = {"dataclasses": [0.0, 0], "regular expressions": [0.0, 0]}
def timing(function, key):
    def timed(*args, **kwargs):
        started = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[key][0] += time.process_time() - started
            spent[key][1] += 1
    return timed
dataclasses._process_class = timing(dataclasses._process_class, "dataclasses")
re._compile = timing(re._compile, "regular expressions")
started = time.process_time()
import installer.app
print(json.dumps({"import": time.process_time() - started, **spent}))
"""


def where_the_import_goes(tree: Path, runs: int) -> dict[str, tuple[float, int]]:
    """Median CPU seconds of `import installer.app` and of its dataclass and regex set-up
    (with how many of each)."""
    samples = []
    for _ in range(runs):
        result = subprocess.run([sys.executable, "-c", WHERE_PROBE], cwd=tree, check=True,
                                env={**os.environ, "PYTHONPATH": str(tree)},
                                capture_output=True, text=True)
        samples.append(json.loads(result.stdout))
    return {key: (statistics.median(s[key] if key == "import" else s[key][0] for s in samples),
                  0 if key == "import" else samples[0][key][1])
            for key in samples[0]}


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
    print(f"\nwhere `import installer.app` spends its CPU (median of {args.runs} runs, seconds)")
    for label, tree in trees.items():
        where = where_the_import_goes(tree, args.runs)
        total = where["import"][0]
        parts = ", ".join(f"{key} {seconds:.3f} ({count}, {seconds / total:.0%})"
                          for key, (seconds, count) in where.items() if key != "import")
        print(f"{label:<11}import {total:.3f}: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
