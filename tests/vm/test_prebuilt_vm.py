"""Compile once per kernel, for real: node A (a CI job on this machine) builds the modules for
the guest's kernel and publishes them to a real registry; node B, a freshly booted guest of
the same kernel with every compiler made unusable, pulls, verifies and loads them."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import kit
import pytest
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
"""


@pytest.fixture(scope="module")
def node_b(vm_kernel: GuestKernel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmResult]:
    www = kit.build_mirror(tmp_path_factory.mktemp("www"), [A])
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
        python=sys.executable,
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
