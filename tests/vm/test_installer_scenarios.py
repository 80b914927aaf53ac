"""`installer run` for real in a booted kernel: cold install, re-run, reboot, upgrade (held and
free), no GPU, modprobe.d options. Three boots share one persistent state disk:

1. two simulated H100s: cold install of A (open modules) in the DaemonSet's view (the host's /
   at /root, the install dir at /usr/local/nvidia, the container's own /lib/firmware), state
   checks, re-run, verify --json; then the open nvidia.ko refuses to start once the GSP
   firmware the installer put on the host is moved away;
2. reboot: reload from the compiled-module cache, a download URL serving A's .run for B is
   refused before anything changes, upgrade to B refused while /dev/nvidia0 is held (A keeps
   working), then upgrade to B once released (staged first: unload and load back to back).
   B's modules are compiled ahead on this machine by `installer prebuild` for the guest's
   kernel and put in the guest's module cache (what a node finds after a prebuild): the first
   boot's cold install is the in-guest compile, and a second one would prove nothing more;
3. the GPUs gone: the installer refuses, and so does the module itself.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kit
import pytest

from vm.guest_kernel import GuestKernel
from vm.harness import BootAndReboot, FakeGpu, VmResult, boot_and_run
from vm.prebuild import prebuild_modules
from vm.scripts import SERVE_WWW, assert_libraries_cached, exit_of, passed_verify

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
A = "580.105.08"
B = "580.126.20"
GPUS = [FakeGpu("0000:00:04.0", "0x2330"), FakeGpu("0000:00:05.0", "0x2330")]
INSTALL = "/home/kubernetes/bin/nvidia"
# The DaemonSet's host mount at /root hides this machine's /root: keep what the guest runs from
# there (a pyenv python, a checkout) at its path inside that view.
KEPT = sorted({Path(p).parts[2] for p in (sys.executable, str(REPO))
               if len(Path(p).parts) > 2 and Path(p).parts[1] == "root"})

PRELUDE = "\n" + SERVE_WWW + f"""\
export PYTHONPATH={REPO} NVIDIA_DRIVER_MIRRORS=http://127.0.0.1:8000
export NVIDIA_DRIVER_DIGESTS_FILE="$VM_FILES/www/digests"
export NVIDIA_INSTALL_DIR_HOST={INSTALL}
installer() {{ {sys.executable} -m installer "$@"; }}
# The DaemonSet's view: host / at /root (ROOT_MOUNT_DIR), the install dir mounted at
# /usr/local/nvidia, and the container's own /lib/firmware, which the kernel never reads.
daemonset() {{
  mkdir -p {INSTALL} /usr/local/nvidia /run/vm-root-home {" ".join("/" + k for k in KEPT)}
  unshare --mount --propagation private -- sh -c 'mount --bind /root /run/vm-root-home &&
    mount --rbind / /root && {"".join(f"mount --bind /run/vm-root-home/{k} /root/{k} && "
                                      for k in KEPT)}
    mount --bind {INSTALL} /usr/local/nvidia && mount -t tmpfs none /lib/firmware &&
    exec "$@"' sh env ROOT_MOUNT_DIR=/root NVIDIA_INSTALL_DIR_CONTAINER=/usr/local/nvidia \
    {sys.executable} -m installer "$@"
}}
step() {{ echo "@@ $1"; rc=0; shift; "$@" 2>&1 || rc=$?; echo "exit=$rc"; }}
state() {{
  echo "@@ $1"
  set +e
  grep -E '^nvidia' /proc/modules | cut -d' ' -f1,3 | sort
  head -1 /proc/driver/nvidia/version
  cat /sys/module/nvidia/version
  for n in /dev/nvidia*; do stat -c '%n %F %t:%T' "$n"; done
  grep nvidia /proc/devices
  ldconfig -p | grep -E 'libnvidia-ml.so.1|libcuda.so.1'
  cat /sys/module/nvidia/parameters/NVreg_RestrictProfilingToAdminUsers
  cat /run/nvidia-driver-installer/driver-ready 2>/dev/null || echo "not ready"
  set -e
}}
"""

FIRST_BOOT = PRELUDE + f"""
echo "options nvidia NVreg_RestrictProfilingToAdminUsers=0" > /etc/modprobe.d/test-nvidia.conf
export NVIDIA_DRIVER_VERSION={A}
step cold daemonset run
state after-cold
echo "@@ host-firmware"; ls /lib/firmware/nvidia/{A}
step rerun daemonset run
step verify installer verify --json
rmmod nvidia_modeset nvidia_uvm nvidia
mv /lib/firmware/nvidia/{A} /lib/firmware/nvidia/{A}.aside
step load-without-host-firmware modprobe nvidia
dmesg -t | grep 'NVRM: ' | tail -n 2
mv /lib/firmware/nvidia/{A}.aside /lib/firmware/nvidia/{A}
"""

SECOND_BOOT = PRELUDE + f"""
state after-reboot
export NVIDIA_DRIVER_VERSION={A}
step reboot-run installer run
state after-reboot-run
step wrong-file env NVIDIA_DRIVER_VERSION={B} \
  NVIDIA_DRIVER_DOWNLOAD_URL=http://127.0.0.1:8000/{A}/NVIDIA-Linux-x86_64-{A}.run \
  NVIDIA_DRIVER_SHA256="$(cut -d' ' -f1 "$VM_FILES"/www/{A}/*.run.sha256sum)" \
  {sys.executable} -m installer run
state after-wrong-file
cp -a "$VM_FILES/modules/{B}" {INSTALL}/cache/modules/
exec 3</dev/nvidia0
step upgrade-held env NVIDIA_DRIVER_VERSION={B} {sys.executable} -m installer run
state while-held
step smi-while-held {INSTALL}/bin/nvidia-smi --query-gpu=driver_version --format=csv,noheader
exec 3<&-
step upgrade env NVIDIA_DRIVER_VERSION={B} NVIDIA_INSTALLER_LOG_FORMAT=json \
  {sys.executable} -m installer run
state after-upgrade
"""

THIRD_BOOT = PRELUDE + f"""
export NVIDIA_DRIVER_VERSION={B}
step no-gpu-run installer run
step no-gpu-modprobe modprobe nvidia
dmesg -t | grep 'NVRM' | tail -n 1
"""


@dataclass(frozen=True)
class Boots(BootAndReboot):
    third: VmResult  # a boot without GPUs, after the reboot


@pytest.fixture(scope="module")
def boots(vm_kernel: GuestKernel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boots]:
    www = kit.build_mirror(tmp_path_factory.mktemp("www"), [A, B])
    modules = prebuild_modules([B], www, vm_kernel.release, tmp_path_factory.mktemp("prebuilt"))
    state = tmp_path_factory.mktemp("vmstate")
    files = {"www": www, "modules": modules}
    first = boot_and_run(FIRST_BOOT, state_dir=state, gpus=GPUS, files=files, timeout=1500)
    second = boot_and_run(SECOND_BOOT, state_dir=state, gpus=GPUS, files=files, timeout=1500)
    third = boot_and_run(THIRD_BOOT, state_dir=state, gpus=[], files=files, timeout=600)
    yield Boots(first, second, third)


def assert_driver_state(section: str, version: str) -> None:
    lines = section.splitlines()
    assert {"nvidia_modeset 0", "nvidia_uvm 0"} <= set(lines), section
    assert any(re.fullmatch(r"nvidia [1-9]\d*", line) for line in lines), section
    assert f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  " in section
    assert version in lines
    for node in ("/dev/nvidiactl character special file c3:ff",
                 "/dev/nvidia0 character special file c3:0",
                 "/dev/nvidia1 character special file c3:1",
                 "/dev/nvidia-modeset character special file c3:fe"):
        assert node in lines, section
    uvm_major = re.search(r"^(\d+) nvidia-uvm$", section, re.MULTILINE)
    assert uvm_major, section
    major = f"{int(uvm_major.group(1)):x}"
    assert f"/dev/nvidia-uvm character special file {major}:0" in lines
    assert f"/dev/nvidia-uvm-tools character special file {major}:1" in lines
    assert_libraries_cached(section, INSTALL)


def test_cold_install_loads_verifies_and_signals_ready(boots: Boots) -> None:
    cold = boots.first.section("cold")
    assert exit_of(cold) == 0, cold
    assert "reached here at /usr/local/nvidia" in cold  # the DaemonSet's view
    assert "step build-modules: compile open modules" in cold
    state = boots.first.section("after-cold")
    assert_driver_state(state, A)
    assert f"DRIVER_VERSION={A}" in state


def test_open_modules_start_because_the_gsp_firmware_reached_the_host(boots: Boots) -> None:
    cold = boots.first.section("cold")
    assert f"installed GSP firmware into /lib/firmware/nvidia/{A}" in cold, cold
    assert boots.first.section("host-firmware").split() == ["gsp_ga10x.bin", "gsp_tu10x.bin"]
    # The control: the same module without the host's firmware does not start.
    refused = boots.first.section("load-without-host-firmware")
    assert exit_of(refused) != 0, refused
    assert "NVRM: RmFetchGspRmImages: No firmware image found" in refused
    assert f"firmware nvidia/{A}/gsp_ga10x.bin: -2" in refused


def test_modprobe_d_option_reaches_the_loaded_module(boots: Boots) -> None:
    state = boots.first.section("after-cold").splitlines()
    assert "0" in state  # NVreg_RestrictProfilingToAdminUsers from /etc/modprobe.d (default 1)


def test_rerun_with_everything_in_place_changes_nothing(boots: Boots) -> None:
    rerun = boots.first.section("rerun")
    assert exit_of(rerun) == 0
    assert "every step was already satisfied" in rerun


def test_verify_json_reports_the_planned_driver(boots: Boots) -> None:
    report = passed_verify(boots.first.section("verify"))
    assert report["driver_version"] == {"nvml": A, "nvidia_smi": A}
    assert [g["pci_bus_id"] for g in report["gpus"]] == [g.address for g in GPUS]


def test_reboot_reloads_from_the_cache_without_a_build(boots: Boots) -> None:
    assert "not ready" in boots.second.section("after-reboot")
    run = boots.second.section("reboot-run")
    assert exit_of(run) == 0, run
    assert "step build-modules: already satisfied" in run
    assert "step fetch-runfile: already satisfied" in run
    assert "step load-modules: load" in run
    assert_driver_state(boots.second.section("after-reboot-run"), A)


def test_a_run_of_another_version_is_refused_before_anything_changes(boots: Boots) -> None:
    wrong = boots.second.section("wrong-file")
    assert exit_of(wrong) == 25, wrong
    assert "error[runfile-mismatch]" in wrong
    assert f"its label names version {A}" in wrong
    assert "step unload-old-driver" not in wrong and "step build-modules" not in wrong
    state = boots.second.section("after-wrong-file")
    assert_driver_state(state, A)
    assert f"DRIVER_VERSION={A}" in state


def test_upgrade_while_held_names_the_holder_and_keeps_the_old_driver(boots: Boots) -> None:
    held = boots.second.section("upgrade-held")
    assert exit_of(held) == 34, held
    assert "error[driver-in-use]" in held
    assert re.search(r"pid \d+ \(bash\) holds /dev/nvidia0", held), held
    # Everything B needs is staged before the refusal: the next attempt only swaps.
    assert "step install-userspace: done" in held
    assert_driver_state(boots.second.section("while-held"), A)
    smi = boots.second.section("smi-while-held")
    assert exit_of(smi) == 0 and A in smi


def test_upgrade_in_place_replaces_the_driver(boots: Boots) -> None:
    upgrade = boots.second.section("upgrade")
    assert exit_of(upgrade) == 0, upgrade
    # Staged by the refused attempt (the modules came from the prebuild, above).
    assert "step install-userspace: already satisfied" in upgrade
    assert "step build-modules: already satisfied" in upgrade
    assert "unloaded nvidia" in upgrade
    state = boots.second.section("after-upgrade")
    assert_driver_state(state, B)
    assert f"DRIVER_VERSION={B}" in state


def test_upgrade_stages_everything_then_unloads_and_loads_back_to_back(boots: Boots) -> None:
    events = [json.loads(line) for line in boots.second.section("upgrade").splitlines()
              if line.startswith("{")]
    messages = [e["message"] for e in events]
    first_unload = next(i for i, m in enumerate(messages) if m.startswith("unloaded "))
    loaded = messages.index("loaded nvidia-modeset")
    staged = [m for m in messages[:first_unload]
              if m.startswith(("installed modules into", "installed GSP firmware into"))]
    assert len(staged) == 2, messages
    between = [m for m in messages[first_unload:loaded] if m.startswith("step ")]
    quick = ("step unload-old-driver", "step activate-install", "step configure-ld-cache",
             "step load-modules")
    assert all(m.startswith(quick) for m in between), between
    gap = _seconds(events[loaded]["time"]) - _seconds(events[first_unload]["time"])
    print(f"\nupgrade: no driver loaded from {events[first_unload]['time']} to "
          f"{events[loaded]['time']} ({gap:.3f} s)")


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def test_without_gpus_the_installer_and_the_module_refuse(boots: Boots) -> None:
    run = boots.third.section("no-gpu-run")
    assert exit_of(run) == 16, run
    assert "error[no-nvidia-gpu]" in run
    probe = boots.third.section("no-gpu-modprobe")
    assert exit_of(probe) != 0
    assert "No such device" in probe
    assert "NVRM: No NVIDIA GPU found." in probe
