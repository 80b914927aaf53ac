"""Compile once per kernel, for real: node A (a CI job on this machine) builds the modules for
the guest's kernel and publishes them to a real registry; node B, a freshly booted guest of
the same kernel with every compiler made unusable, pulls, verifies and loads them. Then IMEX
is turned on there (the DRA driver's hostManaged mode): a re-run of `installer run` installs
nvidia-imex of the driver's version from the redist tree, `installer imex` runs it with the
domain's nodes, `nvidia-imex-ctl -q` on the socket the installer configured answers READY, the
readiness file appears, and SIGTERM takes the daemon, its socket and the file."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import kit
import pytest
from kit.imex import build_imex
from lib.hostkit import installer_env, make_debian_host, run_installer
from lib.httpfaults import serve_directory
from lib.registrykit import PASSWORD, USER, Registry, make_key_pair

from vm.guest_kernel import GuestKernel
from vm.harness import FakeGpu, VmResult, boot_and_run
from vm.scripts import NO_COMPILERS, exit_of

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
A = "580.105.08"
INSTALL = "/home/kubernetes/bin/nvidia"
REPOSITORY_PATH = "gpu/nvidia-modules"

STATE = "/run/nvidia-driver-installer"
IMEX_DIR = f"{INSTALL}/etc/nvidia-imex"
SOCKET = f"{IMEX_DIR}/imex_ctrl.sock"
NODES = ("10.0.0.1", "10.0.0.2")
# The installed node turns IMEX on (the DRA driver's hostManaged mode): a re-run of `installer
# run` installs IMEX of the driver's version from the redist tree on the guest's mirror, then
# `installer imex` (the imex container's command) runs it; nvidia-imex-ctl -q on the socket the
# installer configured is what the DRA driver's kubelet plugin asks. Last in the script, so
# the sections above are as they were; imex-seconds is what it adds to the boot. Without -e:
# each section is printed whatever the one before it did, and the tests read them.
IMEX = """\
set +e
imex_started=$(date +%s)
export NVIDIA_IMEX=install NVIDIA_FABRICMANAGER_REDIST=http://127.0.0.1:8000/redist
step imex-install {python} -m installer run
echo "@@ imex-installed"; ls -1 {install}/versions/{version}/bin | grep imex
NVIDIA_IMEX_NODES={nodes} {python} -m installer imex 2>/tmp/imex.log &
for _ in $(seq 120); do test -f {state}/imex-ready && break; sleep 1; done
echo "@@ imex-ready"; cat {state}/imex-ready
step imex-query {install}/versions/{version}/bin/nvidia-imex-ctl -q --u={socket}
echo "@@ imex-files"
stat -c '%n %F' {socket}
cat {imex_dir}/config.cfg {imex_dir}/nodes_config.cfg
tr '\\0' ' ' < /proc/$(pgrep -f "versions/{version}/bin/nvidia-imex -c" | head -1)/cmdline
echo
echo "@@ imex-stopped"
kill $!; wait $! || echo "exit $?"
pgrep -f "bin/nvidia-imex" || echo "no daemon"
ls -1A {imex_dir} {state}
echo "@@ imex-log"; cat /tmp/imex.log
echo "@@ imex-seconds"; echo $(( $(date +%s) - imex_started ))
"""


# Every compiler, assembler, linker and make a build could reach is replaced by a shim that
# records its call and fails: a single compiler process on node B shows in compiler-calls.
NODE_B = """
ip link set lo up
python3 -m http.server --bind 127.0.0.1 8000 --directory "$VM_FILES/www" >/dev/null 2>&1 &
docker-registry serve {config} >/tmp/registry.log 2>&1 &
for port in 8000 {port}; do
  for _ in $(seq 200); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $port))" 2>/dev/null \\
      && break
    sleep 0.1
  done
done
""" + NO_COMPILERS + """\
export PYTHONPATH={repo} NVIDIA_DRIVER_MIRRORS=http://127.0.0.1:8000
export NVIDIA_DRIVER_DIGESTS_FILE="$VM_FILES/www/digests"
export NVIDIA_INSTALL_DIR_HOST={install} NVIDIA_DRIVER_VERSION={version}
export NVIDIA_MODULE_REGISTRY=127.0.0.1:{port}/{path} NVIDIA_MODULE_REGISTRY_PLAIN_HTTP=true
export NVIDIA_MODULE_REGISTRY_USERNAME={user} NVIDIA_MODULE_REGISTRY_PASSWORD={password}
export NVIDIA_MODULE_TRUSTED_KEYS="$VM_FILES/www/keys/publisher.pub"
step() {{ echo "@@ $1"; rc=0; shift; "$@" 2>&1 || rc=$?; echo "exit=$rc"; }}
step shim-works gcc --version
rm -f /tmp/compiler-calls
step plan {python} -m installer plan
step run {python} -m installer run
echo "@@ state"
grep -E '^nvidia' /proc/modules | cut -d' ' -f1 | sort
head -1 /proc/driver/nvidia/version
cat /tmp/compiler-calls 2>/dev/null || echo "no compiler process"
""" + IMEX


@pytest.fixture(scope="module")
def node_b(vm_kernel: GuestKernel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmResult]:
    www = tmp_path_factory.mktemp("www")
    build_imex(A, www / "redist")  # IMEX's archive and redistrib JSON, in the digests too
    www = kit.build_mirror(www, [A])
    private, _public = make_key_pair(www / "keys")  # node B gets the public key only
    private = private.replace(tmp_path_factory.mktemp("builder-key") / private.name)
    registry = Registry(tmp_path_factory.mktemp("registry")).start()
    try:
        root = tmp_path_factory.mktemp("node-a")
        kernel = make_debian_host(root, gpus=())
        assert kernel == vm_kernel.release, "the headers and the guest kernel must match"
        with serve_directory(www) as (base, _requests):
            env = installer_env(
                root, kernel, NVIDIA_DRIVER_VERSION=A, NVIDIA_DRIVER_MIRRORS=base,
                NVIDIA_DRIVER_DIGESTS_FILE=str(www / "digests"),
                NVIDIA_MODULE_REGISTRY=registry.repository(REPOSITORY_PATH),
                NVIDIA_MODULE_REGISTRY_PLAIN_HTTP="true",
                NVIDIA_MODULE_REGISTRY_USERNAME=USER, NVIDIA_MODULE_REGISTRY_PASSWORD=PASSWORD,
                NVIDIA_MODULE_PUBLISHER_KEY=str(private),
            )
            env.pop("NVIDIA_KERNEL_RELEASE")
            built = run_installer(env, "prebuild", "--kernel", kernel, "--push", timeout=900)
        assert built.returncode == 0, built.stderr[-3000:]
    finally:
        registry.stop()
    script = NODE_B.format(
        config=registry.workdir / "config.yml", port=registry.port, path=REPOSITORY_PATH,
        repo=REPO, install=INSTALL, version=A, user=USER, password=PASSWORD,
        python=sys.executable, state=STATE, socket=SOCKET, imex_dir=IMEX_DIR,
        nodes=",".join(NODES),
    )
    yield boot_and_run(script, gpus=[FakeGpu("0000:00:04.0", "0x2330")], files={"www": www},
                       timeout=1500)


def test_node_b_loads_the_published_modules_with_no_compiler_process(node_b: VmResult) -> None:
    assert node_b.exit_code == 0, node_b.console[-4000:]
    assert exit_of(node_b.section("shim-works")) == 1  # the shims really stand in the way
    plan = node_b.section("plan")
    assert exit_of(plan) == 0, plan
    assert re.search(r"prebuilt-modules: 127\.0\.0\.1:\d+/gpu/nvidia-modules@sha256:[0-9a-f]{64}",
                     plan), plan
    assert "signed by sha256:" in plan, plan
    run = node_b.section("run")
    assert exit_of(run) == 0, run
    assert "using prebuilt modules" in run
    assert "step build-modules: already satisfied" in run
    state = node_b.section("state")
    assert {"nvidia", "nvidia_modeset", "nvidia_uvm"} <= set(state.splitlines()), state
    assert f"NVIDIA UNIX Open Kernel Module for x86_64  {A}" in state
    assert "no compiler process" in state, state


def test_a_rerun_with_imex_on_installs_imex_of_the_drivers_version(node_b: VmResult) -> None:
    rerun = node_b.section("imex-install")
    assert exit_of(rerun) == 0, rerun
    assert "step install-imex: done in" in rerun, rerun
    assert "step build-modules: already satisfied" in rerun, rerun
    assert node_b.section("imex-installed").splitlines() == ["nvidia-imex", "nvidia-imex-ctl"]


def test_installer_imex_answers_ready_on_the_socket_it_configured(node_b: VmResult) -> None:
    ready = dict(line.split("=", 1) for line in node_b.section("imex-ready").splitlines())
    assert {k: v for k, v in ready.items() if k != "PID"} == {
        "DRIVER_VERSION": A, "STATE": "running", "IMEX": "READY", "SOCKET": SOCKET}, ready
    # What the DRA driver's kubelet plugin asks before it hands out a channel.
    assert node_b.section("imex-query").splitlines() == ["READY", "exit=0"]
    files = node_b.section("imex-files").splitlines()
    assert files[0] == f"{SOCKET} socket", files
    config = f"{IMEX_DIR}/config.cfg"
    assert files[1:-1] == ["DAEMONIZE=0", f"IMEX_NODE_CONFIG_FILE={IMEX_DIR}/nodes_config.cfg",
                           "IMEX_CMD_ENABLED=1", "IMEX_CMD_PORT=50005",
                           f"IMEX_CMD_UNIX_DOMAIN_PATH={SOCKET}", *NODES], files
    # The daemon the readiness file names, of the driver's version, with the installer's config.
    assert files[-1].split()[-3:] == [f"{INSTALL}/versions/{A}/bin/nvidia-imex", "-c", config]
    assert f"IMEX {A} started: 2 node(s), command socket {SOCKET}" in node_b.section("imex-log")


def test_stopping_installer_imex_takes_the_socket_and_the_readiness_file(
        node_b: VmResult) -> None:
    # SIGTERM to the container's command: it exits 0 (no "exit N" line) once nvidia-imex is
    # down; the daemon took its socket with it, the command its readiness file; the config and
    # the driver's readiness file stay.
    assert node_b.section("imex-stopped").splitlines() == [
        "no daemon", f"{IMEX_DIR}:", "config.cfg", "nodes_config.cfg", "", f"{STATE}:",
        "driver-ready"]
    log = node_b.section("imex-log")
    assert log.index("imex: signal 15: stopping") < log.index(f"IMEX {A} stopped"), log
    assert int(node_b.section("imex-seconds")) > 0
