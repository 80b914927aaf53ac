"""The VM harness itself: exit codes, the crafted PCI tree, the state disk, timeouts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vm.guest_kernel import GuestKernel
from vm.harness import FakeGpu, GuestLockup, VmError, boot_and_run
from vm.module_tree import kept_module_files

pytestmark = pytest.mark.vm

GPU = FakeGpu(address="0000:00:07.0", device="0x27b8")

FIRST_BOOT = f"""
echo "@@ pci"
cat /sys/bus/pci/devices/{GPU.address}/{{vendor,device,class,subsystem_vendor,subsystem_device}}
echo "@@ real-devices"; cat /sys/bus/pci/devices/*/vendor | sort -u
echo "@@ network"; ls /sys/class/net
echo "@@ mounts"; findmnt -n -o FSTYPE /run
echo "@@ files"; cat "$VM_FILES/greeting"
mkdir -p /var/lib/vm-probe && echo kept > /var/lib/vm-probe/file
rm /etc/os-release
echo "@@ modules"
k=$(uname -r)
find /lib/modules/$k -name '*.ko' | wc -l
mkdir -p /lib/modules/$k/updates
cp /lib/modules/$k/kernel/drivers/block/loop.ko /lib/modules/$k/updates/probe.ko
depmod && grep -c '^updates/probe.ko:' /lib/modules/$k/modules.dep
exit 7
"""

SECOND_BOOT = f"""
echo "@@ persisted"
cat /var/lib/vm-probe/file
ls /etc/os-release 2>&1 || true
echo "@@ pci"; ls /sys/bus/pci/devices/{GPU.address} 2>&1 || true
echo "@@ modules"; grep -c '^updates/probe.ko:' /lib/modules/$(uname -r)/modules.dep
"""


def _children_of_this_process() -> list[str]:
    """This process's qemu children (the worker may also run the test control plane's
    processes, started by tests/lib/controlplane.py for other tests)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text.split("(", 1)[1].rsplit(")", 1)[0]
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and comm.startswith("qemu"):
            children.append(stat.parent.name)
    return children


def test_reboot_keeps_root_filesystem_writes_in_the_state_dir(
    vm_kernel: GuestKernel, tmp_path: Path
) -> None:
    greeting = tmp_path / "greeting.txt"
    greeting.write_text("hello from the host\n")
    state = tmp_path / "state"

    first = boot_and_run(
        FIRST_BOOT,
        state_dir=state,
        gpus=[GPU],
        files={"greeting": greeting},
        kernel=vm_kernel.release,
    )
    second = boot_and_run(SECOND_BOOT, state_dir=state, kernel=vm_kernel.release)

    assert first.exit_code == 7, first.console
    assert first.section("pci").split() == ["0x10de", "0x27b8", "0x030200", "0x10de", "0x16c1"]
    assert "0x1af4" in first.section("real-devices").split()  # qemu's virtio devices stay
    assert first.section("network").split() == ["lo"]
    assert first.section("mounts").split() == ["tmpfs"]
    assert first.section("files") == "hello from the host"
    assert second.exit_code == 0, second.console
    assert second.section("persisted").splitlines() == [
        "kept",
        "ls: cannot access '/etc/os-release': No such file or directory",
    ]
    assert "No such file or directory" in second.section("pci")
    assert not Path("/var/lib/vm-probe").exists()
    assert Path("/etc/os-release").exists()
    # The guest's module tree (tests/vm/module_tree.py): the kept modules only, so depmod takes
    # seconds under TCG, not a minute; what is installed there survives the reboot.
    count, installed = first.section("modules").split()
    assert int(count) == len(kept_module_files(vm_kernel)) < 100
    assert installed == "1"
    assert second.section("modules").strip() == "1"
    assert not (vm_kernel.modules_dir / "updates/probe.ko").exists()



def test_timeout_kills_qemu(vm_kernel: GuestKernel) -> None:
    with pytest.raises(VmError, match="timed out"):
        boot_and_run("sleep 600", timeout=4, kernel=vm_kernel.release)

    assert _children_of_this_process() == []


LOCKS_UP = """
echo "@@ attempt"
if [ -e /var/lib/vm-probe/attempted ]; then echo "the disk kept the last attempt"
else echo fresh; fi
mkdir -p /var/lib/vm-probe && touch /var/lib/vm-probe/attempted && sync
echo "<0>watchdog: BUG: soft lockup - CPU#0 stuck for 26s! [exe:214]" > /dev/kmsg
sleep 600
"""


def test_a_lockup_stops_the_guest_at_once_and_the_boot_is_retried_once_from_the_same_disk(
        vm_kernel: GuestKernel, tmp_path: Path) -> None:
    """What the watchdog prints is written to the kernel log by the scenario; the harness must
    stop qemu within seconds (not at the timeout) and retry the boot once on the disk as it
    was before the first attempt."""
    with pytest.warns(UserWarning, match="soft lockup"), \
            pytest.raises(GuestLockup, match="locked up") as caught:
        boot_and_run(LOCKS_UP, state_dir=tmp_path / "state", timeout=500,
                     kernel=vm_kernel.release)
    assert "fresh" in caught.value.console
    assert "the disk kept the last attempt" not in caught.value.console
    assert not list((tmp_path / "state").glob("*.before-boot"))
    assert _children_of_this_process() == []
