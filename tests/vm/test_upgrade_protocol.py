"""The upgrade protocol in a booted kernel: driver A is loaded and held by a process
standing for NVIDIA's device plugin (it keeps /dev/nvidia0 and /dev/nvidiactl open, as NVML's
health checker does); a version bump to B with the protocol on cordons the node, pauses the
plugin by label (a real Kubernetes control plane runs in the guest, with the shipped RBAC and
admission policy and the installer's pod-bound token; tests/vm/guest_cluster.py plays the
DaemonSet controller and kubelet: the plugin's process is stopped once its label says paused),
evicts the GPU pod, unloads A, installs and verifies B, restores the labels and uncordons: no
manual step. Runs with the same version make
no API write. A last attempt back to A, held by a host process no label pauses, times out and
leaves B loaded with B's modules in /lib/modules. One boot. The modules of A and B are
compiled ahead on this machine by `installer prebuild` for the guest's kernel and put in the
guest's module cache (what a node finds after a prebuild): this test is about the protocol,
the in-guest compile is proven by test_installer_scenarios.py.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kit
import pytest
from lib import controlplane

from installer.layout import READY_FILE
from vm.guest_kernel import GuestKernel
from vm.harness import FakeGpu, VmResult, boot_and_run
from vm.prebuild import prebuild_modules
from vm.scripts import exit_of

pytestmark = pytest.mark.vm


REPO = Path(__file__).resolve().parents[2]
A = "580.105.08"
B = "580.126.20"
GPUS = [FakeGpu("0000:00:04.0", "0x2330")]
INSTALL = "/home/kubernetes/bin/nvidia"
NODE = "gpu-node-1"
PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
MEMORY_MIB = 2048

SCENARIO = f"""
ip link set lo up
python3 -m http.server --bind 127.0.0.1 8000 --directory "$VM_FILES/www" >/dev/null 2>&1 &
export PYTHONPATH={REPO}:{REPO}/tests
py={sys.executable}
wait_for() {{ for _ in $(seq 600); do eval "$1" && return 0; sleep 0.1; done; return 1; }}
wait_for '$py -c "import socket; socket.create_connection((\\"127.0.0.1\\", 8000))" 2>/dev/null'
export NVIDIA_DRIVER_MIRRORS=http://127.0.0.1:8000 NVIDIA_INSTALL_DIR_HOST={INSTALL}
export NVIDIA_DRIVER_DIGESTS_FILE="$VM_FILES/www/digests"
export NVIDIA_INSTALLER_UPGRADE_PROTOCOL=true NODE_NAME={NODE}
export NVIDIA_INSTALLER_KUBECONFIG=/tmp/kubeconfig
installer() {{ $py -m installer "$@"; }}
step() {{ echo "@@ $1"; rc=0; shift; "$@" 2>&1 || rc=$?; echo "exit=$rc"; }}
# What the server stores now (tests/vm/guest_cluster.py dumps it when asked).
cluster() {{ echo "@@ $1"; rm -f /tmp/cluster.json; touch /tmp/cluster.want
  wait_for "test -s /tmp/cluster.json" || {{ echo "no dump"; cat /tmp/guest-cluster.log; }}
  cat /tmp/cluster.json; echo; }}

# The real control plane (etcd, kube-apiserver, controller manager, scheduler) boots in the
# guest while driver A installs: the node gpu-node-1 with a GPU pod and the device plugin's
# pod, the shipped RBAC and admission policy, the installer's pod-bound token. The installer
# gets its kubeconfig only after that first install: until then the protocol has nothing to
# do and makes no call.
$py -m vm.guest_cluster --node {NODE} --label {PLUGIN_LABEL}=true \\
  --label cloud.google.com/gke-accelerator=nvidia-h100-80gb \\
  --pod ml/train-0=1 --pod kube-system/nvidia-device-plugin-x1=0 \\
  --device-plugin-pod kube-system/nvidia-device-plugin-x1 --plugin-pid-file /tmp/plugin.pid \\
  --holders-seen /tmp/holders-seen \\
  --kubeconfig /tmp/cluster-kubeconfig --ready /tmp/cluster.ready \\
  --dump /tmp/cluster.json --dump-request /tmp/cluster.want >/tmp/guest-cluster.log 2>&1 &
cluster_pid=$!
export NVIDIA_DRIVER_VERSION={A}
mkdir -p {INSTALL}/cache/modules
cp -a "$VM_FILES/modules/{A}" {INSTALL}/cache/modules/
step install-a installer run
echo "@@ driver-a"; cat /sys/module/nvidia/version || true; ls /dev/nvidia* || true
test -e /dev/nvidia0 || {{ echo "driver A is not loaded: nothing to upgrade"; exit 1; }}

# NVIDIA's device plugin: NVML open for its whole life; on SIGTERM it is slow to shut down:
# it holds the driver until the installer has told the server it waits for it (a fixed sleep
# raced a loaded guest: the installer came to look after the plugin had gone). It writes its own
# pid ($! may name a shell between us and it).
$py -c '
import os, signal, time
def stop(*_):
    for _ in range(3000):  # at most 5 minutes
        if os.path.exists("/tmp/holders-seen"):
            break
        time.sleep(0.1)
    os._exit(0)
open("/proc/self/comm", "w").write("nvidia-device-p")
signal.signal(signal.SIGTERM, stop)
held = [open("/dev/nvidiactl", "rb"), open("/dev/nvidia0", "rb")]
open("/tmp/plugin.pid.tmp", "w").write(str(os.getpid()))
os.rename("/tmp/plugin.pid.tmp", "/tmp/plugin.pid")
while True:
    time.sleep(1)
' >/tmp/plugin.log 2>&1 &
wait_for "test -s /tmp/plugin.pid" || {{ echo "the plugin did not start"; ls -l /dev/nvidia*;
  cat /tmp/plugin.log; exit 1; }}
plugin=$(cat /tmp/plugin.pid)
for _ in $(seq 9000); do  # seconds on a host, minutes in a guest under TCG
  test -e /tmp/cluster.ready && break; kill -0 $cluster_pid 2>/dev/null || break; sleep 0.1
done
test -e /tmp/cluster.ready || {{ echo "the control plane did not start"; free -m;
  cat /tmp/guest-cluster.log; tail -n 30 /tmp/control-plane-*/*.log || true; exit 1; }}
cp /tmp/cluster-kubeconfig /tmp/kubeconfig

step rerun-a installer run
cluster after-rerun-a
echo "@@ plugin-before"; ls -l /proc/$plugin/fd | grep -o '/dev/nvidia[a-z0-9]*' | sort || true

cp -a "$VM_FILES/modules/{B}" {INSTALL}/cache/modules/  # after A's run pruned other versions
step upgrade-b env NVIDIA_DRIVER_VERSION={B} $py -m installer run
cluster after-upgrade
echo "@@ plugin-after"
grep -qs 'State:.*[RSD]' /proc/$plugin/status && echo "plugin alive" || echo "plugin gone"
echo "@@ driver-after"
cat /sys/module/nvidia/version
cat {READY_FILE} 2>/dev/null || echo "not ready"

step rerun-b env NVIDIA_DRIVER_VERSION={B} $py -m installer run
cluster after-rerun-b

# A holder no label pauses (a host process): going back to A times out waiting for it; the
# node is restored, B stays loaded and /lib/modules holds B's modules again, not A's staged
# ones (a reboot's modprobe would otherwise load A under B's user space).
$py -c '
import os, time
open("/proc/self/comm", "w").write("dcgm-hostengine")
held = open("/dev/nvidia0", "rb")
open("/tmp/stuck.pid.tmp", "w").write(str(os.getpid()))
os.rename("/tmp/stuck.pid.tmp", "/tmp/stuck.pid")
time.sleep(600)
' &
wait_for "test -s /tmp/stuck.pid" || {{ echo "the stuck holder did not start"; exit 1; }}
cp -a "$VM_FILES/modules/{A}" {INSTALL}/cache/modules/
step stuck-a env NVIDIA_DRIVER_VERSION={A} NVIDIA_INSTALLER_HOLDERS_TIMEOUT=2 $py -m installer run
cluster after-stuck-a
echo "@@ modules-after-stuck-a"
cat /sys/module/nvidia/version
cat /lib/modules/$(uname -r)/updates/nvidia-driver-installer/.installer-stamp
modinfo -F version nvidia
readlink {INSTALL}/current
kill "$(cat /tmp/stuck.pid)"
echo "@@ guest-cluster"; cat /tmp/guest-cluster.log; free -m
"""


@pytest.fixture(scope="module")
def boot(vm_kernel: GuestKernel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmResult]:
    # The guest runs the control plane this machine built (its binaries are in the 9p root).
    reason = controlplane.missing()
    if reason is not None:
        if os.environ.get("CI"):  # CI's scripts/install-deps builds it: missing is a failure
            pytest.fail(reason)
        pytest.skip(reason)
    www = kit.build_mirror(tmp_path_factory.mktemp("www"), [A, B])
    modules = prebuild_modules([A, B], www, vm_kernel.release, tmp_path_factory.mktemp("prebuilt"))
    # The control plane's components want about 1 GiB besides what the installer uses.
    yield boot_and_run(SCENARIO, gpus=GPUS, files={"www": www, "modules": modules},
                       timeout=2400, memory=MEMORY_MIB)


def cluster_state(boot: VmResult, name: str) -> dict[str, Any]:
    section = boot.section(name)
    state: dict[str, Any] = json.loads(section[section.index("{"): section.rindex("}") + 1])
    return state


def test_same_version_runs_make_no_api_write(boot: VmResult) -> None:
    assert exit_of(boot.section("install-a")) == 0, boot.console[-4000:]
    rerun = boot.section("rerun-a")
    assert exit_of(rerun) == 0, rerun
    assert "every step was already satisfied" in rerun
    assert cluster_state(boot, "after-rerun-a")["writes"] == []
    assert exit_of(boot.section("rerun-b")) == 0
    before, after = (cluster_state(boot, n)["writes"] for n in ("after-upgrade",
                                                                 "after-rerun-b"))
    assert before and after == before


def test_held_upgrade_completes_with_no_manual_step(boot: VmResult) -> None:
    assert boot.section("plugin-before").split() == ["/dev/nvidia0", "/dev/nvidiactl"]
    upgrade = boot.section("upgrade-b")
    assert exit_of(upgrade) == 0, upgrade
    assert "step build-modules: already satisfied" in upgrade  # B's prebuilt modules were used
    assert re.search(rf"upgrade {A} -> {B}: node {NODE} cordoned it", upgrade), upgrade
    assert "evicted GPU pod ml/train-0" in upgrade
    assert re.search(r"waiting for processes to close /dev/nvidia\*: pid \d+ \(nvidia-device-p\)"
                     r" holds /dev/nvidia", upgrade), upgrade
    assert "unloaded nvidia" in upgrade
    assert f"upgrade {A} -> {B} done: node {NODE} uncordoned, labels restored" in upgrade
    assert boot.section("plugin-after").strip() == "plugin gone"
    driver = boot.section("driver-after")
    assert driver.splitlines()[0] == B
    assert f"DRIVER_VERSION={B}" in driver


def test_node_ends_uncordoned_with_labels_restored_and_every_phase_visible(
        boot: VmResult) -> None:
    state = cluster_state(boot, "after-upgrade")
    node = state["node"]
    assert "unschedulable" not in node["spec"]
    assert node["metadata"]["labels"][PLUGIN_LABEL] == "true"
    assert node["metadata"]["labels"]["nvidia-driver-installer/upgrade-state"] == "upgrade-done"
    # The server drops an emptied map: the restore removed the node's only annotation.
    assert "nvidia-driver-installer/upgrade" not in node["metadata"].get("annotations", {})
    reasons = [e["reason"] for e in state["events"]]
    # DraPluginPaused: the DRA kubelet plugin's label (absent here, so set like the device
    # plugin's) is paused once no GPU pod is left.
    assert reasons == ["DriverUpgradeStarted", "GpuPodEvicted", "DraPluginPaused",
                       "WaitingForDriverHolders", "DriverUnloading", "DriverUpgradeDone"], \
        state["events"]
    waiting = next(e for e in state["events"] if e["reason"] == "WaitingForDriverHolders")
    assert re.search(r"PIDs \d+ hold the driver", waiting["message"])
    # The device plugin's pod (no GPU request) is left to its DaemonSet; only GPU pods go, by
    # a DELETE the admission policy holds to this node (never an Eviction: it cannot).
    assert [w for w in state["writes"] if "/pods/" in w] == [
        "DELETE /api/v1/namespaces/ml/pods/train-0"]


def test_an_upgrade_that_times_out_leaves_the_loaded_drivers_modules_on_the_host(
        boot: VmResult) -> None:
    stuck = boot.section("stuck-a")
    assert exit_of(stuck) == 74, stuck
    assert re.search(r"pid \d+ \(dcgm-hostengine\) holds /dev/nvidia0", stuck), stuck
    assert f"the loaded driver {B} stays" in stuck
    loaded, stamp, modinfo, current = boot.section("modules-after-stuck-a").strip().splitlines()[:4]
    assert (loaded, stamp.split()[0], modinfo, current) == (B, B, B, f"versions/{B}")
    node = cluster_state(boot, "after-stuck-a")["node"]
    assert "unschedulable" not in node["spec"]
    assert node["metadata"]["labels"][PLUGIN_LABEL] == "true"
    assert node["metadata"]["labels"]["nvidia-driver-installer/upgrade-state"] == "upgrade-failed"
