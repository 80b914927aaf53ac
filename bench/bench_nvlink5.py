"""What `installer fabricmanager` adds on an NVLink5 node (HGX B200) before Fabric Manager
runs: from the supervisor seeing the verified driver to NVLSM's first line, from there to its
socket (the stand-in's own start), and from the socket to nv-fabricmanager's first line (our
wait loop and the spawn). The kit's stand-ins on a B200 host root, as tests/integration/
test_nvlsm.py runs them; no driver is loaded here, so each nv-fabricmanager exits once it asks
the driver (the kit cannot complete an NVLink5 fabric: see bench/RESULTS.md).

    python3 bench/bench_nvlink5.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from kit.fabricmanager import build_fabricmanager  # noqa: E402
from kit.nvlink5 import hgx_b200_ports, write_cx7_port  # noqa: E402
from kit.nvlsm import build_nvlsm  # noqa: E402
from lib.hosttrees import B200, make_host, write_driver_version  # noqa: E402

from installer.components import fm_archive, nvlsm_archive  # noqa: E402
from installer.components.fabricmanager import FabricManagerDaemon  # noqa: E402
from installer.components.supervisor import Supervisor  # noqa: E402
from installer.config import from_env  # noqa: E402
from installer.errors import FabricManagerFailed  # noqa: E402
from installer.hostroot import HostRoot  # noqa: E402
from installer.layout import READY_FILE, Layout  # noqa: E402

V = "580.105.08"
SM = "2025.10.12"


class Timed(FabricManagerDaemon):
    """Records when each daemon said its first line."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.first: dict[str, float] = {}

    def _line(self, line: str) -> None:
        key = "nvlsm" if line.startswith("nvlsm: ") else "fm"
        self.first.setdefault(key, time.monotonic())
        if "SUBNET UP" in line:
            self.first.setdefault("socket", time.monotonic())
        super()._line(line)


def host(top: Path, work: Path) -> tuple[HostRoot, dict[str, str]]:
    root = make_host(top, gpus=[B200] * 8)
    for port in hgx_b200_ports():
        write_cx7_port(top, port)
    write_driver_version(top, V)
    root.write_atomic(READY_FILE, f"DRIVER_VERSION={V}\nINSTALL_DIR=/var/lib/nvidia\n")
    env = {"ROOT_MOUNT_DIR": str(top), "NVIDIA_INSTALL_DIR_CONTAINER": str(top) + "-none"}
    layout = Layout.from_config(from_env(env), root)
    tree = fm_archive.unpack(build_fabricmanager(V, work / "redist"), work / "fm")
    fm_archive.install(tree, layout.version_dir(V), fm_archive.config_dir(layout, V), V)
    nvlsm_archive.unpack_and_install(build_nvlsm(SM, work / "cuda"), work / "sm", layout, V, SM)
    return root, env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="b5-", dir="/tmp"))  # a socket path fits 107 bytes
    work = Path(tempfile.mkdtemp(prefix="bench-nvlink5-"))
    os.environ["NVFAKE_TEST_ROOT"] = str(top)
    try:
        root, env = host(top, work)
        spans: dict[str, list[float]] = {"to_nvlsm": [], "nvlsm_to_socket": [],
                                         "socket_to_fm": [], "total": []}
        for _ in range(args.rounds):
            daemon = Timed(from_env(env), root, env={},
                           run_dir=top / "var/run/nvidia-fabricmanager")
            started = time.monotonic()
            try:
                Supervisor(daemon, root, restarts=0, poll=0.02).run()
            except FabricManagerFailed:
                pass
            finally:
                daemon.close()
            t = daemon.first
            spans["to_nvlsm"].append(t["nvlsm"] - started)
            spans["nvlsm_to_socket"].append(t["socket"] - t["nvlsm"])
            spans["socket_to_fm"].append(t["fm"] - t["socket"])
            spans["total"].append(t["fm"] - started)
        load = os.getloadavg()
        print(f"rounds: {args.rounds}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
              f"{os.cpu_count()} CPUs")
        for name, values in spans.items():
            print(f"{name:16} median {statistics.median(values) * 1000:7.1f} ms  "
                  f"max {max(values) * 1000:7.1f} ms")
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
