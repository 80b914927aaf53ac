"""One boot: the node has no headers for its kernel and no route to its package
sources; the headers come from the mirror setting (Debian's real header packages in a signed
archive on 127.0.0.1), the modules are built against them and loaded, and the host's package
database is left as it was."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import kit
import pytest
from lib.headerrepos import make_key, publish_apt, real_debian_debs
from lib.hostkit import debian_headers

from vm.guest_kernel import GuestKernel
from vm.harness import FakeGpu, VmResult, boot_and_run
from vm.scripts import SERVE_WWW, exit_of

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
VERSION = "580.105.08"
INSTALL = "/home/kubernetes/bin/nvidia"

SCENARIO = "\n" + SERVE_WWW + """\
step() {{ echo "@@ $1"; rc=0; shift; "$@" 2>&1 || rc=$?; echo "exit=$rc"; }}
# No headers on this node, and its sources (Debian's archive, unreachable here) trust the
# archive key that the mirror's Release is signed with.
mount -t tmpfs none /usr/src
mount -t tmpfs none {kbuild}
rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*
cp "$VM_FILES/keyring" /usr/share/keyrings/test-archive-keyring.gpg
cat > /etc/apt/sources.list.d/debian.sources <<'END'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/test-archive-keyring.gpg
END
touch /tmp/before-run
export PYTHONPATH={repo} NVIDIA_DRIVER_MIRRORS=http://127.0.0.1:8000/runfiles
export NVIDIA_DRIVER_DIGESTS_FILE="$VM_FILES/www/digests"
export NVIDIA_INSTALL_DIR_HOST={install} NVIDIA_DRIVER_VERSION={version}
export NVIDIA_INSTALLER_HEADERS_MIRROR=http://127.0.0.1:8000/debian
step plan {python} -m installer plan
step run {python} -m installer run
echo "@@ loaded"
grep -E '^nvidia' /proc/modules | cut -d' ' -f1 | sort
cat /sys/module/nvidia/version
modinfo -F vermagic {install}/drivers/nvidia.ko
echo "@@ cache"
cat {install}/cache/headers/$(uname -r)/.complete
ls -1 {install}/cache/headers/$(uname -r)/root/usr/src
echo "@@ host-package-state"
find /var/lib/dpkg /var/lib/apt /var/cache/apt -newer /tmp/before-run 2>/dev/null | head -5
echo "end"
"""


@pytest.fixture(scope="module")
def boot(vm_kernel: GuestKernel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmResult]:
    found = debian_headers()
    assert found is not None
    kernel, trees = found
    if kernel != vm_kernel.release:
        pytest.skip(f"the guest runs {vm_kernel.release}, the headers are for {kernel}")
    debs = real_debian_debs(kernel)
    assert debs is not None, "Debian's header .debs are missing: run scripts/install-deps"
    work = tmp_path_factory.mktemp("headers-vm")
    key = make_key(work / "key")
    www = work / "www"
    publish_apt(www / "debian", "bookworm", debs, key)
    kit.build_runfile(VERSION, www / "runfiles" / VERSION)
    kit.write_digests(www / "digests", www / "runfiles")  # a mirror serves bytes only
    script = SCENARIO.format(kbuild=trees[2], repo=REPO, install=INSTALL, version=VERSION,
                             python=sys.executable)
    yield boot_and_run(script, gpus=[FakeGpu("0000:00:04.0", "0x2330")],
                       files={"www": www, "keyring": key.keyring}, timeout=2400)


def test_plan_names_the_mirror_as_the_headers_source(boot: VmResult) -> None:
    plan = boot.section("plan")
    assert exit_of(plan) == 0, plan
    assert "kernel-headers: fetch linux-headers-" in plan
    assert "the mirror http://127.0.0.1:8000/debian (in place of the URIs in " \
        "/etc/apt/sources.list.d/debian.sources)" in plan
    assert "compiler: gcc-12" in plan or "compiler: gcc\n" in plan


def test_modules_built_against_the_fetched_headers_are_loaded(boot: VmResult) -> None:
    run = boot.section("run")
    assert exit_of(run) == 0, run
    assert run.index("step kernel-headers") < run.index("step fetch-runfile"), run
    loaded = boot.section("loaded").splitlines()
    assert {"nvidia", "nvidia_modeset", "nvidia_uvm"} <= set(loaded), loaded
    assert VERSION in loaded
    release = boot.section("cache").splitlines()[0].removeprefix("linux-headers-")
    assert any(line.startswith(f"{release} SMP") for line in loaded), loaded


def test_headers_are_cached_by_kernel_and_the_host_database_is_untouched(boot: VmResult) -> None:
    lines = boot.section("cache").splitlines()
    assert lines[0].startswith("linux-headers-") and lines[0].endswith("-amd64")
    assert lines[1].endswith("-common") and lines[2].startswith("linux-kbuild-")
    assert any(line.endswith("-common") for line in lines[3:])
    assert boot.section("host-package-state").strip() == "end"
