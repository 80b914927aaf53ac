"""What `installer fabricmanager` adds on an NVLink5 node (HGX B200) before Fabric Manager
runs: from the supervisor seeing the verified driver to NVLSM's first line, from there to its
socket (the stand-in's own start), and from the socket to nv-fabricmanager's first line (our
wait loop and the spawn). The kit's stand-ins on a B200 host root, as tests/integration/
test_nvlsm.py runs them; no driver is loaded here, so each nv-fabricmanager exits once it asks
the driver.

With --vm, the same in a booted guest whose kit nvidia.ko drives two B200 GPUs (tests/vm/
b200.py, as tests/vm/test_hgx_b200_vm.py sets it up): each round runs the container's
supervisor with its own poll until the readiness file, so it also measures Fabric Manager's
start to its switches configured and from there to NVML's fabric COMPLETED as the installer
polls it (driver loaded -> fabric complete).

    python3 bench/bench_nvlink5.py [--rounds 10] [--vm]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
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
from installer.components.fabricmanager_daemon import CONFIGURED, FabricManagerDaemon  # noqa: E402
from installer.components.supervisor import Running, Supervisor  # noqa: E402
from installer.config import from_env  # noqa: E402
from installer.errors import FabricManagerFailed  # noqa: E402
from installer.hostroot import HostRoot  # noqa: E402
from installer.layout import READY_FILE, Layout  # noqa: E402

V = "580.105.08"
SM = "2025.10.12"


class Timed(FabricManagerDaemon):
    """Records when each daemon said its first line, when Fabric Manager said the switches
    are configured and when the readiness file's content was first there (then sets `done`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.first: dict[str, float] = {}
        self.done = threading.Event()

    def _line(self, line: str) -> None:
        key = "nvlsm" if line.startswith("nvlsm: ") else "fm"
        self.first.setdefault(key, time.monotonic())
        if "SUBNET UP" in line:
            self.first.setdefault("socket", time.monotonic())
        if CONFIGURED in line:
            self.first.setdefault("configured", time.monotonic())
        super()._line(line)

    def ready(self, running: Running) -> str | None:
        content = super().ready(running)
        if content is not None:
            self.first.setdefault("ready", time.monotonic())
            self.done.set()
        return content


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


def report(rounds: int, spans: dict[str, list[float]]) -> None:
    load = os.getloadavg()
    print(f"rounds: {rounds}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{os.cpu_count()} CPUs")
    for name, values in spans.items():
        print(f"{name:22} median {statistics.median(values) * 1000:7.1f} ms  "
              f"max {max(values) * 1000:7.1f} ms")


def in_guest(rounds: int) -> None:
    """In the booted B200 guest (tests/vm/b200.py's setup): the container's supervisor as
    `installer fabricmanager` runs it (its poll, NVML every NVML_EVERY s), stopped once ready."""
    root, config = HostRoot(Path("/")), from_env(dict(os.environ))
    spans: dict[str, list[float]] = {name: [] for name in (
        "to_nvlsm", "nvlsm_to_socket", "socket_to_fm", "fm_to_configured",
        "configured_to_complete", "total")}
    for _ in range(rounds):
        daemon = Timed(config, root)
        supervisor = Supervisor(daemon, root, restarts=0, stop=daemon.done)
        started = time.monotonic()
        try:
            supervisor.run()
        finally:
            daemon.close()
        t = daemon.first
        spans["to_nvlsm"].append(t["nvlsm"] - started)
        spans["nvlsm_to_socket"].append(t["socket"] - t["nvlsm"])
        spans["socket_to_fm"].append(t["fm"] - t["socket"])
        spans["fm_to_configured"].append(t["configured"] - t["fm"])
        spans["configured_to_complete"].append(t["ready"] - t["configured"])
        spans["total"].append(t["ready"] - started)
    report(rounds, spans)


def in_vm(rounds: int) -> None:
    """Boots the guest kernel with the B200 node set up and runs --guest there."""
    from vm.b200 import BOARD, DELIVER_NVLSM, DRIVER, IB_UP, prepare
    from vm.guest_kernel import find_guest_kernel
    from vm.harness import boot_and_run

    kernel = find_guest_kernel()
    if kernel is None:
        sys.exit("no guest kernel in /boot (apt-get install linux-image-amd64)")
    work = Path(tempfile.mkdtemp(prefix="bench-nvlink5-vm-"))
    try:
        files = prepare(work, kernel.modules_dir / "build")
        script = (DRIVER + IB_UP + DELIVER_NVLSM + "echo '@@ bench'\n"
                  f"{sys.executable} {Path(__file__).resolve()} --guest --rounds {rounds}\n")
        result = boot_and_run(script, gpus=BOARD, files=files, timeout=600 + 30 * rounds,
                              kernel=kernel.release)
        if result.exit_code != 0:
            sys.exit(result.console[-4000:])
        load = os.getloadavg()
        print(f"guest ({kernel.release}, {len(BOARD)} B200 GPUs); this machine's load average "
              f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(result.section("bench").strip())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--vm", action="store_true",
                        help="in a booted guest with the kit's B200s, until fabric complete")
    parser.add_argument("--guest", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vm:
        in_vm(args.rounds)
        return
    if args.guest:
        in_guest(args.rounds)
        return
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
        report(args.rounds, spans)
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
