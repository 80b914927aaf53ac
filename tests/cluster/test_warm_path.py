"""With the protocol off the installer never loads its API client (DESIGN: of cluster/, the
warm path with the protocol off loads only the upgrade gate and the gate steps)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The cluster room's run-time side, which every run loads: the upgrade gate (what stands between
# a held driver and its unload) and the gate steps. Its API client, the protocol and the gate
# itself load inside their functions, only when the protocol or the gate is on.
RUN_TIME_SIDE = ["installer.cluster", "installer.cluster.upgrade_gate",
                 "installer.cluster.scheduling_gate_steps"]


def cluster_modules_loaded_by(code: str) -> list[str]:
    """Run `code` in a fresh interpreter (tests/ importable, lib.contexts' held_host and
    pathlib's Path at hand) and return the yaml and installer.cluster modules it loaded beyond
    RUN_TIME_SIDE: a fresh one, so no module this test process already holds counts."""
    script = f"""
import json, sys
from pathlib import Path
sys.path[:0] = [{str(REPO / 'tests')!r}]
from lib.contexts import held_host
{code}
loaded = [m for m in sys.modules if m.startswith(("yaml", "installer.cluster"))
          and m not in {RUN_TIME_SIDE!r}]
print(json.dumps(sorted(loaded)))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_protocol_off_imports_no_cluster_code(tmp_path: Path) -> None:
    """The warm path with the protocol off never loads the API client."""
    assert cluster_modules_loaded_by(f"""
from installer import app, steps
from installer.errors import DriverInUse
try:
    steps.unload_old_step(held_host(Path({str(tmp_path)!r}))).apply()
except DriverInUse:
    pass
""") == []


def test_gate_off_an_unload_imports_no_cluster_code(tmp_path: Path) -> None:
    """With the scheduling gate (and the protocol) off, an unload that goes ahead
    passes the gate's hook without loading installer.cluster."""
    assert cluster_modules_loaded_by(f"""
import shutil
from installer import steps
ctx = held_host(Path({str(tmp_path)!r}))
shutil.rmtree(Path({str(tmp_path)!r}) / "proc" / "4242")  # nothing holds the driver
try:
    steps.unload_old_step(ctx).apply()
except Exception as error:  # the fake rmmod unloads nothing; the step's check is not run here
    print("unexpected", error, file=sys.stderr)
    raise
assert [c.argv[0] for c in ctx.runner.calls] == ["rmmod", "rmmod"], ctx.runner.calls
""") == []
