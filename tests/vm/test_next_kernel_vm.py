"""The next kernel before the reboot, for real: one boot pair on one state disk.

1. The guest boots Debian's 6.1.0-47 (its packages unpacked outside the clone, its files put in
   place in the guest as installing it leaves them) while this machine's newer 6.1.0-56 is
   installed too. `installer run` installs, loads and verifies the driver for 6.1.0-47 (its
   modules compiled ahead on this machine with `installer prebuild`, already in the node's
   cache: the guest compiles only what this test is about), marks the node ready, and only then
   compiles the modules for 6.1.0-56 into the cache.
2. Reboot into 6.1.0-56 with every compiler, assembler, linker and make replaced by a shim that
   records its call and fails, and no download server: the run loads the prepared modules
   (insmod from the cache: /lib/modules is read-only in this boot, see SECOND_BOOT).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kit
import pytest
from lib.hostkit import installer_env, make_debian_host, run_installer
from lib.httpfaults import serve_directory
from lib.secondkernel import SECOND, add_headers, unpacked

from installer.nextkernel import is_newer
from vm.guest_kernel import GuestKernel, unpacked_guest_kernel
from vm.harness import BootAndReboot, FakeGpu, boot_and_run
from vm.scripts import NO_COMPILERS, SERVE_WWW, exit_of

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
A = "580.105.08"
GPUS = [FakeGpu("0000:00:04.0", "0x2330")]
CACHE = f"/var/lib/nvidia/cache/modules/{A}"

PRELUDE = f"""
export PYTHONPATH={REPO} NVIDIA_DRIVER_MIRRORS=http://127.0.0.1:8000 NVIDIA_DRIVER_VERSION={A}
export NVIDIA_DRIVER_DIGESTS_FILE="$VM_FILES/www/digests"
installer() {{ {sys.executable} -m installer "$@"; }}
step() {{ echo "@@ $1"; rc=0; shift; "$@" 2>&1 || rc=$?; echo "exit=$rc"; }}
state() {{
  echo "@@ $1"
  set +e
  uname -r
  grep -E '^nvidia' /proc/modules | cut -d' ' -f1 | sort
  head -1 /proc/driver/nvidia/version
  cat /run/nvidia-driver-installer/driver-ready 2>/dev/null || echo "not ready"
  set -e
}}
"""

# (after PRELUDE) The running kernel's own files, as its packages installed them.
FIRST_BOOT = """
for path in boot/vmlinuz-{k} lib/modules/{k} usr/src/linux-headers-{k} \\
            usr/src/linux-headers-{abi}-common; do
  ln -s "{unpacked}/$path" "/$path"
done
""" + SERVE_WWW + """\
mkdir -p {cache}/{k}
cp -a "$VM_FILES/modules-{k}" {cache}/{k}/open
step plan installer plan
step run installer run
state after-run
step status installer status
echo "@@ cache"; ls {cache}
"""

# Every compiler, assembler, linker and make a build could reach records its call and fails
# (NO_COMPILERS); no server answers on 127.0.0.1:8000.
SECOND_BOOT = PRELUDE + "\n" + NO_COMPILERS + """\
# The guest's depmod over this machine's ~4000 modules of 6.1.0-56 through 9p takes minutes
# under TCG: a read-only /lib/modules (as on COS-like hosts) makes the run load with insmod from
# the cache, which is where the prepared modules are.
mount --bind -o ro "/lib/modules/$(uname -r)" "/lib/modules/$(uname -r)"
step shim-works gcc --version
rm -f /tmp/compiler-calls
state after-reboot
step run installer run
state after-run
echo "@@ compilers"; cat /tmp/compiler-calls 2>/dev/null || echo "no compiler process"
"""


@dataclass(frozen=True)
class Boots(BootAndReboot):
    next_kernel: str  # the release the reboot came up on


@pytest.fixture(scope="module")
def boots(vm_kernel: GuestKernel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boots]:
    assert is_newer(vm_kernel.release, SECOND), (vm_kernel.release, SECOND)
    base = unpacked()
    www = kit.build_mirror(tmp_path_factory.mktemp("www"), [A])
    ahead = tmp_path_factory.mktemp("ahead")
    make_debian_host(ahead, gpus=(), headers=False)
    add_headers(ahead)
    with serve_directory(www) as (url, _requests):
        env = installer_env(ahead, SECOND, NVIDIA_DRIVER_VERSION=A, NVIDIA_DRIVER_MIRRORS=url,
                            NVIDIA_DRIVER_DIGESTS_FILE=str(www / "digests"))
        env.pop("NVIDIA_KERNEL_RELEASE")
        built = run_installer(env, "prebuild", "--kernel", SECOND, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    state = tmp_path_factory.mktemp("vmstate")
    files = {"www": www, f"modules-{SECOND}": Path(built.stdout.strip())}
    first = boot_and_run(
        PRELUDE + FIRST_BOOT.format(k=SECOND, abi=SECOND.removesuffix("-amd64"),
                                    unpacked=base, cache=CACHE),
        state_dir=state, gpus=GPUS, files=files, timeout=1500,
        kernel=unpacked_guest_kernel(base, SECOND))
    second = boot_and_run(SECOND_BOOT, state_dir=state, gpus=GPUS, timeout=900,
                          kernel=vm_kernel.release)
    yield Boots(first, second, vm_kernel.release)


def test_the_run_on_the_old_kernel_installs_first_then_prepares_the_next(boots: Boots) -> None:
    nxt = boots.next_kernel
    plan = boots.first.section("plan")
    assert exit_of(plan) == 0, plan
    assert f"  next-kernel: {nxt}: prepared after this install" in plan
    assert f"compiled against its headers (on the host at /usr/src/linux-headers-{nxt})" in plan
    run = boots.first.section("run")
    assert exit_of(run) == 0, run
    ready = run.index("driver ready: wrote /run/nvidia-driver-installer/driver-ready")
    prepare = run.index("step prepare-next-kernel: modules for the installed kernel")
    done = run.index(f"next kernel {nxt}: modules ready in")
    assert ready < prepare < done < run.index("step prune-cache:"), run
    # One compile, the next kernel's, after the node was ready (the running kernel's modules
    # were in the cache).
    assert "step build-modules: already satisfied" in run[:ready]
    builds = re.findall(r"building open modules for kernel (\S+)", run)
    assert builds == [nxt], run
    state = boots.first.section("after-run").splitlines()
    assert state[0] == SECOND
    assert {"nvidia", "nvidia_modeset", "nvidia_uvm"} <= set(state), state
    assert f"KERNEL_RELEASE={SECOND}" in state
    assert boots.first.section("cache").split() == sorted([SECOND, nxt])


def test_status_shows_the_next_kernels_modules_ready(boots: Boots) -> None:
    import json

    section = boots.first.section("status")
    assert exit_of(section) == 0, section
    shown = json.loads(section[section.index("{"): section.rindex("}") + 1])["next_kernel"]
    assert shown["kernel"] == boots.next_kernel and shown["modules_ready"] is True
    assert shown["last_attempt"]["state"] == "ready"


def test_the_reboot_into_the_next_kernel_loads_with_no_compile_and_no_download(
        boots: Boots) -> None:
    nxt = boots.next_kernel
    assert exit_of(boots.second.section("shim-works")) == 1  # the shims stand in the way
    before = boots.second.section("after-reboot").splitlines()
    assert before[0] == nxt and "not ready" in before
    run = boots.second.section("run")
    assert exit_of(run) == 0, run
    for name in ("kernel-headers", "check-compiler", "fetch-runfile", "extract-runfile",
                 "build-modules", "install-userspace", "install-module-files"):
        assert f"step {name}: already satisfied" in run, run
    assert "step load-modules: load" in run
    state = boots.second.section("after-run").splitlines()
    assert {"nvidia", "nvidia_modeset", "nvidia_uvm"} <= set(state), state
    assert f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {A}  " in "\n".join(state)
    assert f"KERNEL_RELEASE={nxt}" in state
    assert boots.second.section("compilers") == "no compiler process"
    total = re.search(r"INFO  done in (\d+\.\d+) s \(", run)
    prepared = re.search(rf"next kernel {nxt}: modules ready in (\d+\.\d+) s",
                         boots.first.section("run"))
    assert total and prepared, run
    print(f"\n(TCG) preparing {nxt} on {SECOND} after ready: {prepared.group(1)} s; the run "
          f"after the reboot into {nxt}: {total.group(1)} s")
