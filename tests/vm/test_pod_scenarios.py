"""The product image, built for real (tests/lib/podimage.py), run as the DaemonSet's pod with runc
in a booted kernel (tests/pod), for three manifests: ours (the debian overlay rendered), seeds/000's
and GKE's Ubuntu shape, each with only the installer's `image:` changed. Two boots share one disk:

1. ours: the initContainer installs A on the VM's kernel, then the readiness container starts
   and its probe passes as uid 65534 with no capabilities; `installer uninstall` on the host
   turns the probe to failing and removes the device nodes with their /dev/char links. Then
   seeds/000's DaemonSet installs `auto` (B) from a cache prefilled with `installer download`,
   as on an air-gapped node, with B's modules as `installer prebuild` leaves them (ours' pod
   is the in-container compile; this one is about the seeds' layout).
   Ours runs its `persistenced` container (the kit's nvidia-persistenced, persistence mode on)
   and an idle `fabricmanager` one: the uninstall stops that nvidia-persistenced (SIGTERM, in
   its container's PID namespace) before it unloads.
2. after a reboot: GKE's shape (no hostPID, no hostNetwork, no /run mount) reloads B; then, with
   /dev/nvidia0 held, ours (upgrade protocol off: no API server in the guest) asks for A: the
   initContainer fails and its termination file names error[driver-in-use], the holder (read
   from /root/proc, without hostPID) and the hint (A's modules are in the cache as
   `installer prebuild` on this machine leaves them: ours' first pod is the in-container
   compile, the refusal is what this one is about). Then the board turns into an HGX one (two
   NVSwitch functions join the simulated PCI tree): B reinstalled by hand fetches Fabric
   Manager from the redist tree on 127.0.0.1 and `installer verify` fails (fabric not started);
   ours runs nv-fabricmanager in its `fabricmanager` container and verify passes; a killed
   nv-fabricmanager is restarted; one of another version cannot be kept up and the container
   exits with error[fabricmanager-failed]; an uninstall stops nvidia-persistenced first.
   Last the board turns into an HGX B200 (tests/vm/pod_b200.py): B200 GPU, ConnectX-7 Limited
   PFs, the IB modules in the kernel's tree. The pod, NVLSM pinned: its initContainer loads the
   IB modules and installs NVLSM, but with no IB device on the Limited PF the fabricmanager
   container stops with error[nvlsm-missing], no readiness file, verify names NVLSM; once
   mlx5_ib made the devices the pod again runs NVLSM on the LPF's GUID, then Fabric Manager,
   the fabric completes and every probe passes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kit
import pytest
import yaml
from kit.fabricmanager import build_fabricmanager
from lib.manifests import DAEMONSET_DIR, FIXTURES, render
from lib.podimage import TOOLS, Buildah, Built, build_debian_image, pause_image
from lib.podspec import Image

from vm.b200 import assert_fabric_manager_started_on_nvlsm
from vm.guest_kernel import GuestKernel
from vm.harness import FakeGpu, VmResult, boot_and_run
from vm.pod_b200 import LPF_GUID, SM, b200_manifest, prepare_b200
from vm.pod_b200 import scenario as b200_scenario
from vm.prebuild import prebuild_modules

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
A = "580.105.08"  # our DaemonSet's pin
B = "580.126.20"  # what `auto` picks for an H100 (newest LTS), the seeds' DaemonSets set none
GPUS = [FakeGpu("0000:00:04.0", "0x2330")]
INSTALL = "/home/kubernetes/bin/nvidia"
SEED_PAUSE = "jdcloud-cn-north-1.jcr.service.jdcloud.com/k8s/pause-amd64:3.1"
GKE_PAUSE = "gcr.io/google-containers/pause:2.0"
GUEST_FILES = "/run/vm/files/f"  # where the harness puts files={"f": ...} in the guest


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the pod scenarios cannot run: {reason}")
    pytest.skip(reason)


def _with_image(manifest: Path, image: str, dest: Path) -> Path:
    """The manifest with only the installer initContainer's `image:` replaced."""
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    for doc in docs:
        if doc.get("kind") == "DaemonSet":
            for container in doc["spec"]["template"]["spec"]["initContainers"]:
                if container["name"] == "nvidia-driver-installer":
                    container["image"] = image
    dest.write_text(yaml.safe_dump_all(docs))
    return dest


def _fabric(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours pinned to B with Fabric Manager from the guest's redist tree, the upgrade protocol
    off, and a fabricmanager container that gives up after two restarts."""
    docs = json.loads(json.dumps(_protocol_off(docs)))
    for doc in docs:
        if doc.get("kind") == "DaemonSet":
            doc["metadata"]["name"] = "nvidia-driver-installer-fabric"
            spec = doc["spec"]["template"]["spec"]
            for container in spec["initContainers"]:
                for env in container["env"]:
                    if env["name"] == "NVIDIA_DRIVER_VERSION":
                        env["value"] = B
                container["env"].append({"name": "NVIDIA_FABRICMANAGER_REDIST",
                                         "value": "http://127.0.0.1:8000/redist"})
            for container in spec["containers"]:
                if container["name"] == "fabricmanager":
                    container["env"].append({"name": "NVIDIA_INSTALLER_DAEMON_RESTARTS",
                                             "value": "2"})
    return docs


def _protocol_off(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    docs = json.loads(json.dumps(docs))
    for doc in docs:
        if doc.get("kind") == "DaemonSet":
            doc["metadata"]["name"] += "-no-protocol"
            for container in doc["spec"]["template"]["spec"]["initContainers"]:
                for env in container.get("env", []):
                    if env["name"] == "NVIDIA_INSTALLER_UPGRADE_PROTOCOL":
                        env["value"] = "false"
    return docs


PRELUDE = f"""
ip link set lo up
python3 -m http.server --bind 127.0.0.1 8000 --directory {GUEST_FILES}/www >/dev/null 2>&1 &
for _ in $(seq 100); do
  python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8000))' 2>/dev/null && break
  sleep 0.1
done
# What a node's init system does for its container runtime: the cgroup2 hierarchy.
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup
# The operator's digests file: the mirror on :8000 serves bytes only.
export NVIDIA_INSTALL_DIR_HOST={INSTALL} NVIDIA_DRIVER_DIGESTS_FILE={GUEST_FILES}/www/digests
installer() {{ PYTHONPATH={REPO} {sys.executable} -m installer "$@"; }}
pod() {{
  local action=$1 name=$2
  PYTHONPATH={REPO}/tests {sys.executable} -m pod "$action" --manifest "{GUEST_FILES}/$name.yaml" \\
    --state "/run/pod/$name" --pci-tree /run/vm-pci ${{POD_ARGS:-}} \\
    $(cat {GUEST_FILES}/images)
}}
step() {{ echo "@@ $1"; rc=0; shift; "$@" 2>&1 || rc=$?; echo "exit=$rc"; }}
state() {{
  echo "@@ $1"
  set +e
  shopt -s nullglob
  grep -E '^nvidia' /proc/modules | cut -d' ' -f1 | sort
  cat /sys/module/nvidia/version
  for n in /dev/nvidia*; do stat -c '%n %t:%T' "$n"; done
  for l in /dev/char/*; do
    case "$(readlink "$l")" in ../nvidia*) echo "link $l -> $(readlink "$l")";; esac
  done
  ldconfig -p | grep -E 'libnvidia-ml.so.1|libcuda.so.1'
  cat /run/nvidia-driver-installer/driver-ready 2>/dev/null || echo "not ready"
  shopt -u nullglob
  set -e
}}
"""

FIRST_BOOT = PRELUDE + f"""
step ours-download installer download --version {A} --mirrors http://127.0.0.1:8000 \\
  --dest {INSTALL}/cache/downloads
step ours-pod pod run ours
state ours-state
step ours-uninstall installer uninstall
step ours-probe-after-uninstall pod probe ours
state ours-after-uninstall
pod stop ours >/dev/null
step seed-download installer download --mirrors http://127.0.0.1:8000 \\
  --dest {INSTALL}/cache/downloads
mkdir -p {INSTALL}/cache/modules
cp -a {GUEST_FILES}/modules/{B} {INSTALL}/cache/modules/
step seed-pod pod run seed000
state seed-state
pod stop seed000 >/dev/null
"""

SECOND_BOOT = PRELUDE + f"""
state after-reboot
step gke-pod pod run gke
state gke-state
pod stop gke >/dev/null
step held-download installer download --version {A} --mirrors http://127.0.0.1:8000 \\
  --dest {INSTALL}/cache/downloads
# A's modules as a prebuild leaves them (seed000's prune dropped the ones ours compiled).
cp -a {GUEST_FILES}/modules/{A} {INSTALL}/cache/modules/
exec 3</dev/nvidia0
step held-pod pod run ours-no-protocol
state held-state
exec 3<&-
pod stop ours-no-protocol >/dev/null

# An HGX board: two NVSwitch functions; the driver registers them once reloaded.
for a in 0000:00:08.0 0000:00:09.0; do
  mkdir -p /run/vm-pci/$a
  echo 0x10de > /run/vm-pci/$a/vendor; echo 0x22a3 > /run/vm-pci/$a/device
  echo 0x068000 > /run/vm-pci/$a/class; echo 0x10de > /run/vm-pci/$a/subsystem_vendor
  echo 0x1796 > /run/vm-pci/$a/subsystem_device
done
rmmod nvidia_modeset nvidia_uvm nvidia
rm -f /run/nvidia-driver-installer/driver-ready
step fabric-run env NVIDIA_FABRICMANAGER_REDIST=http://127.0.0.1:8000/redist \
  NVIDIA_DRIVER_MIRRORS=http://127.0.0.1:8000 PYTHONPATH={REPO} {sys.executable} -m installer \
  run --version {B}
echo "@@ fabric-switches"; ls /proc/driver/nvidia-nvswitch/devices
step fabric-verify-before installer verify --json
step fabric-pod pod run ours-fabric
ready() {{
  pod probe ours-fabric | python3 -c 'import json, sys
sys.exit(0 if all(r["exit_code"] == 0 for r in json.load(sys.stdin).values()) else 1)'
}}
for _ in $(seq 180); do ready && break; sleep 1; done
step fabric-probes pod probe ours-fabric
step fabric-verify-after installer verify --json
# stdout is the guest's console, a terminal: `ls -1` for one name a line.
echo "@@ fabric-markers"; cat /run/nvidia-driver-installer/fabricmanager-ready \
  /run/nvidia-driver-installer/persistenced-ready; ls -1 /run/nvidia-persistenced
# nv-fabricmanager dies: the driver drops the fabric, the container starts it again.
kill -9 $(pgrep -f "versions/{B}/bin/nv-fabricmanager")
sleep 1
for _ in $(seq 180); do ready && break; sleep 1; done
step fabric-verify-restarted installer verify --json
# A Fabric Manager of another version in its place: the container gives up.
tar -xJf {GUEST_FILES}/www/redist/fabricmanager/linux-x86_64/\
fabricmanager-linux-x86_64-{A}-archive.tar.xz -C /tmp
cp /tmp/fabricmanager-linux-x86_64-{A}-archive/bin/nv-fabricmanager \
  {INSTALL}/versions/{B}/bin/nv-fabricmanager
kill -9 $(pgrep -f "versions/{B}/bin/nv-fabricmanager")
for _ in $(seq 180); do
  runc --root /run/pod/ours-fabric/runtime state fabricmanager | grep -q '"stopped"' && break
  sleep 1
done
echo "@@ fabric-gave-up"
runc --root /run/pod/ours-fabric/runtime state fabricmanager | grep '"status"'
cat /run/pod/ours-fabric/fabricmanager/termination-log
echo "@@ fabric-fm-log"; cat /run/pod/ours-fabric/fabricmanager/log
# An unload stops our nvidia-persistenced first, in its container.
step fabric-uninstall installer uninstall
echo "@@ fabric-after-uninstall"
grep -E '^nvidia' /proc/modules || echo "no nvidia module"
ls -1A /run/nvidia-persistenced; ls -1 /run/nvidia-driver-installer
step fabric-probes-after pod probe ours-fabric
pod stop ours-fabric >/dev/null
""" + b200_scenario(GUEST_FILES, B)


@dataclass
class Boots:
    built: Built
    first: VmResult
    second: VmResult


def prepare_files(built: Built, pause: Image, files: Path, kernel: str,
                  kernel_build_dir: Path) -> Path:
    """What the guest gets: the manifests, the images' configs and arguments, the runfiles,
    Fabric Manager's and NVLSM's redist tree, A's and B's modules prebuilt for the guest's
    `kernel`, and the HGX B200 board (pod_b200.py)."""
    files.mkdir()
    images = {built.ref: built.image, SEED_PAUSE: pause, GKE_PAUSE: pause}
    lines = []
    for index, (name, image) in enumerate(images.items()):
        config = files / f"config-{index}.json"
        config.write_text(json.dumps(image.config))
        lines.append(f"--image {name}={image.rootfs}:{GUEST_FILES}/{config.name}")
    (files / "images").write_text(" ".join(lines))
    ours = render(DAEMONSET_DIR / "overlays" / "debian")
    (files / "ours.yaml").write_text(yaml.safe_dump_all(ours))
    # No API server runs in the guest: the held upgrade is the protocol-off path (with it on,
    # the run stops at cluster-api-unavailable before staging, tests/unit/test_activation.py).
    (files / "ours-no-protocol.yaml").write_text(yaml.safe_dump_all(_protocol_off(ours)))
    (files / "ours-fabric.yaml").write_text(yaml.safe_dump_all(_fabric(ours)))
    _with_image(FIXTURES / "seed000-jdcloud-daemonset.yaml", built.ref, files / "seed000.yaml")
    _with_image(FIXTURES / "gke-ubuntu-daemonset.yaml", built.ref, files / "gke.yaml")
    for version in (A, B):
        kit.build_runfile(version, files / "www" / version)
        build_fabricmanager(version, files / "www" / "redist")
    sha256 = prepare_b200(files, kernel_build_dir, B)
    (files / "ours-b200.yaml").write_text(yaml.safe_dump_all(b200_manifest(_fabric(ours),
                                                                          sha256, GUEST_FILES)))
    kit.write_digests(files / "www" / "digests", files / "www")
    modules = prebuild_modules([A, B], files / "www", kernel, files.parent / "prebuilt")
    shutil.copytree(modules, files / "modules", symlinks=True)
    return files


@pytest.fixture(scope="module")
def boots(vm_kernel: GuestKernel, kernel_build_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boots]:
    for tool in TOOLS:
        if shutil.which(tool) is None:
            _missing(f"{tool} is not installed (apt-get install {tool})")
    if os.geteuid() != 0:
        _missing("buildah (vfs, chroot isolation) and runc need root")
    work = tmp_path_factory.mktemp("pod")
    buildah = Buildah(work / "storage")
    try:
        built = build_debian_image(buildah, work)
        files = prepare_files(built, pause_image(work), work / "files", vm_kernel.release,
                              kernel_build_dir)
        state = work / "vmstate"
        first = boot_and_run(FIRST_BOOT, state_dir=state, gpus=GPUS, files={"f": files},
                             timeout=1800)
        # The HGX part at its end reinstalls B by hand and runs three containers; the B200
        # part runs the pod twice more.
        second = boot_and_run(SECOND_BOOT, state_dir=state, gpus=GPUS, files={"f": files},
                              timeout=2700)
        yield Boots(built, first, second)
    finally:
        buildah.remove()


def _report(section: str) -> dict[str, Any]:
    assert re.search(r"^exit=0$", section, re.MULTILINE), section
    # The report is the JSON object from the line "{" on (the containers' output, streamed
    # before it, is prefixed with their names).
    start = re.search(r"^\{$", section, re.MULTILINE)
    assert start, section
    return json.loads(section[start.start(): section.rindex("}") + 1])  # type: ignore[no-any-return]


def _assert_installed(state: str, version: str) -> None:
    lines = state.splitlines()
    assert {"nvidia", "nvidia_modeset", "nvidia_uvm"} <= set(lines), state
    assert version in lines, state
    for node in ("/dev/nvidiactl c3:ff", "/dev/nvidia0 c3:0", "/dev/nvidia-modeset c3:fe"):
        assert node in lines, state
    # Every node the installer made has its /dev/char/<major>:<minor> link.
    for link in ("/dev/char/195:255 -> ../nvidiactl", "/dev/char/195:0 -> ../nvidia0",
                 "/dev/char/195:254 -> ../nvidia-modeset"):
        assert f"link {link}" in lines, state
    uvm = re.search(r"^/dev/nvidia-uvm ([0-9a-f]+):0$", state, re.MULTILINE)
    assert uvm, state
    major = int(uvm.group(1), 16)
    assert f"link /dev/char/{major}:0 -> ../nvidia-uvm" in lines, state
    assert f"link /dev/char/{major}:1 -> ../nvidia-uvm-tools" in lines, state
    assert re.search(rf"libnvidia-ml.so.1 \(libc6,x86-64\) => {INSTALL}/lib64/", state), state
    assert f"DRIVER_VERSION={version}" in lines, state


def test_the_image_is_built_by_buildah_on_the_mmdebstrap_base(boots: Boots) -> None:
    built = boots.built
    assert re.search(r"^\+ buildah .* build --isolation chroot .*images/ubuntu/Dockerfile",
                     built.log, re.MULTILINE), built.log[-2000:]
    assert built.ref == "registry.example.com/nvidia-driver-installer:0.1.0-debian12"
    assert built.image.config["Entrypoint"] == ["installer"]
    assert built.image.config["Cmd"] == ["run"]
    rootfs = built.image.rootfs
    assert (rootfs / "usr/bin/gcc-12").exists()  # Debian 12's kernels are built with gcc-12
    # The compilers its apt sources offer, for kernels built with another gcc.
    listed = (rootfs / "usr/share/nvidia-driver-installer/compiler-packages").read_text()
    assert "12 gcc-12 /usr/bin/gcc-12" in listed.splitlines(), listed
    assert built.image.config["Env"].count(
        "NVIDIA_INSTALLER_COMPILER_PACKAGES=/usr/share/nvidia-driver-installer/compiler-packages"
    ) == 1
    assert (rootfs / "opt/installer/bin/installer").is_file()
    assert not (rootfs / "wheels").exists() and not list((rootfs / "var/lib/apt/lists").glob("*_*"))


def test_our_pod_installs_the_driver_then_its_probe_passes_unprivileged(boots: Boots) -> None:
    report = _report(boots.first.section("ours-pod"))
    (init,) = report["init"]
    assert init["exit_code"] == 0, init["log"]
    assert "step build-modules: compile open modules" in init["log"]
    # next-kernel: `installer prepare-next-kernel --watch`, no readiness probe (the pod is
    # ready without it).
    assert report["started"] == ["driver-ready", "fabricmanager", "persistenced", "next-kernel"]
    assert set(report["probes"]) == {"driver-ready", "fabricmanager", "persistenced"}
    probe = report["probes"]["driver-ready"]
    assert probe["exit_code"] == 0, probe
    assert probe["user"] == {"uid": 65534, "gid": 65534} and probe["capabilities"] == []
    _assert_installed(boots.first.section("ours-state"), A)


def test_uninstall_fails_the_probe_and_takes_nodes_and_links(boots: Boots) -> None:
    assert re.search(r"^exit=0$", boots.first.section("ours-uninstall"), re.MULTILINE)
    uninstall = boots.first.section("ours-uninstall")
    # Ours' persistenced container held /dev/nvidia0: stopped first, not a reason to refuse.
    assert re.search(r"stopping nvidia-persistenced \(pid \d+\) before the driver is "
                     "unloaded", uninstall), uninstall
    probes = _report(boots.first.section("ours-probe-after-uninstall"))
    assert probes["driver-ready"]["exit_code"] == 1
    assert probes["persistenced"]["exit_code"] == 1
    state = boots.first.section("ours-after-uninstall")
    assert "/dev/nvidia" not in state and "link " not in state, state
    assert "not ready" in state


def test_seed000_daemonset_installs_with_only_the_image_changed(boots: Boots) -> None:
    report = _report(boots.first.section("seed-pod"))
    (init,) = report["init"]
    assert init["exit_code"] == 0, init["log"]
    assert "step fetch-runfile: already satisfied" in init["log"]  # the prefilled cache
    assert "step build-modules: already satisfied" in init["log"]  # B's prebuilt modules
    assert report["started"] == ["pause"] and report["probes"] == {}
    _assert_installed(boots.first.section("seed-state"), B)


def test_gke_shape_without_host_namespaces_or_run_mount_reloads_after_reboot(
    boots: Boots,
) -> None:
    assert "not ready" in boots.second.section("after-reboot")
    report = _report(boots.second.section("gke-pod"))
    (init,) = report["init"]
    assert init["exit_code"] == 0, init["log"]
    assert "step load-modules: load" in init["log"]
    assert report["started"] == ["pause"]
    _assert_installed(boots.second.section("gke-state"), B)


def test_a_failing_install_leaves_reference_and_hint_in_the_termination_file(
    boots: Boots,
) -> None:
    report = _report(boots.second.section("held-pod"))
    (init,) = report["init"]
    assert init["exit_code"] == 34, init["log"]
    message = init["termination_message"]
    assert message.startswith("error[driver-in-use]"), message
    # The holder comes from /root/proc: our DaemonSet has no hostPID.
    assert re.search(r"pid \d+ \(bash\) holds /dev/nvidia0", message), message
    assert "\nhint: " in message, message
    assert report["started"] == [], "nothing starts after a failed initContainer"
    _assert_installed(boots.second.section("held-state"), B)


def _json_of(section: str, exit_code: int) -> dict[str, Any]:
    assert re.search(rf"^exit={exit_code}$", section, re.MULTILINE), section
    start = re.search(r"^\{$", section, re.MULTILINE)
    assert start, section
    return json.loads(section[start.start(): section.rindex("}") + 1])  # type: ignore[no-any-return]


def _state_and_status(gpu: dict[str, Any]) -> tuple[str, str]:
    return gpu["fabric"]["state"], gpu["fabric"]["status"]


def test_an_nvswitch_node_is_verified_only_once_fabric_manager_runs(boots: Boots) -> None:
    second = boots.second
    run = second.section("fabric-run")
    assert re.search(r"^exit=0$", run, re.MULTILINE), run
    assert f"fabric-manager = fabricmanager-linux-x86_64-{B}-archive.tar.xz" in run
    assert "step install-fabricmanager: done" in run
    assert second.section("fabric-switches").split() == ["0000:00:08.0", "0000:00:09.0"]
    before = _json_of(second.section("fabric-verify-before"), 40)
    fm_down = ("Fabric Manager (nv-fabricmanager) is not running on this NVSwitch node (2 "
               "NVSwitch function(s) (10de:22a3) at 0000:00:08.0, 0000:00:09.0)")
    assert before["fabric"] == {"required": True, "state": "pending",
                                "nvswitches": ["0000:00:08.0", "0000:00:09.0"],
                                "clique": None, "reasons": [fm_down]}
    assert _state_and_status(before["gpus"][0]) == ("not-started", "success")
    assert before["problems"][0].endswith("NVLink fabric not-started, not completed (CUDA fails "
                                          "with error 802, system not yet initialized)")
    assert f"the fabric is not complete because {fm_down}" in before["problems"]
    # The kit's libcuda in the guest answers cuInit with 802 while the fabric is not registered.
    assert before["gpus"][0]["cuda"]["name"] == "CUDA_ERROR_SYSTEM_NOT_READY"
    assert before["gpus"][0]["cuda"]["error"] == 802
    assert before["problems"][-1].startswith(
        "CUDA cuInit failed: CUDA_ERROR_SYSTEM_NOT_READY (802): system not yet initialized")

    report = _report(second.section("fabric-pod"))
    assert report["init"][0]["exit_code"] == 0, report["init"][0]["log"]
    assert report["started"] == ["driver-ready", "fabricmanager", "persistenced", "next-kernel"]
    probes = _report(second.section("fabric-probes"))
    assert {name: p["exit_code"] for name, p in probes.items()} == {
        "driver-ready": 0, "fabricmanager": 0, "persistenced": 0}
    after = _json_of(second.section("fabric-verify-after"), 0)
    assert after["ok"] and after["fabric"]["state"] == "completed"
    assert [_state_and_status(g) for g in after["gpus"]] == [("completed", "success")]
    assert after["fabric"]["reasons"] == []
    assert [g["persistence_mode"] for g in after["gpus"]] == ["enabled"]
    assert [g["cuda"] for g in after["gpus"]] == [
        {"ok": True, "error": None, "name": None, "meaning": None}]  # the kernel ran
    assert after["cuda"]["library"].endswith(f"/libcuda.so.{B}")
    markers = second.section("fabric-markers").splitlines()
    assert f"DRIVER_VERSION={B}" in markers and "FABRIC=completed" in markers
    assert "PERSISTENCE_MODE=enabled" in markers
    assert {"nvidia-persistenced.pid", "socket"} <= set(markers)  # on the node's /run


def test_fabric_manager_is_restarted_then_given_up_on(boots: Boots) -> None:
    second = boots.second
    restarted = _json_of(second.section("fabric-verify-restarted"), 0)
    assert restarted["fabric"]["state"] == "completed"
    log = second.section("fabric-fm-log")
    assert re.search(r"fabricmanager exited with status -9; restarting it in 1 s \(1 of 2\)",
                     log), log[-3000:]
    assert log.count("Successfully configured all the available NVSwitches") == 2, log[-3000:]
    gave_up = second.section("fabric-gave-up")
    assert '"status": "stopped"' in gave_up, gave_up
    message = gave_up.split("\n", 1)[1]
    assert message.startswith("error[fabricmanager-failed]: fabricmanager exited 3 times "
                              "within 10 minutes"), message
    assert (f"fabric manager NVIDIA GPU driver interface version {A} don't match with driver "
            f"version {B}") in message
    assert "\nhint: nv-fabricmanager (or, on NVLink5 nodes, NVLSM started before it) kept " \
        "exiting" in message


def test_an_uninstall_stops_nvidia_persistenced_in_its_container_first(boots: Boots) -> None:
    second = boots.second
    uninstall = second.section("fabric-uninstall")
    assert re.search(r"^exit=0$", uninstall, re.MULTILINE), uninstall
    assert re.search(r"stopping nvidia-persistenced \(pid \d+\)", uninstall), uninstall
    after = second.section("fabric-after-uninstall").splitlines()
    assert after[0] == "no nvidia module"
    # The daemon removed its pid file and socket on SIGTERM; nothing says ready any more.
    assert "nvidia-persistenced.pid" not in after and "socket" not in after
    assert not [line for line in after if line.endswith("-ready")]
    probes = _report(second.section("fabric-probes-after"))
    assert probes["persistenced"]["exit_code"] == 1
    assert probes["driver-ready"]["exit_code"] == 1


def test_a_b200_whose_limited_pf_has_no_ib_device_is_never_ready(boots: Boots) -> None:
    second = boots.second
    report = _report(second.section("b200-pod"))
    (init,) = report["init"]
    assert init["exit_code"] == 0, init["log"]
    # The initContainer loads the IB modules with the node's modprobe and installs NVLSM.
    assert "step load-ib-modules: " in init["log"] and "step install-nvlsm: " in init["log"]
    assert set(second.section("b200-modules").split()) == {"mlx5_core", "mlx5_ib", "ib_umad"}
    installed = second.section("b200-nvlsm-installed").split()
    assert "nvlsm" in installed and "nv-fabricmanager" in installed, installed
    assert installed[-2] == SM, installed  # the marker: the pinned version, then its SHA-256
    # The fabricmanager container cannot start NVLSM: no IB device, no port GUID. It stops
    # with nvlsm-missing in its termination file; no readiness file, its probe fails.
    stopped = second.section("b200-stopped")
    assert '"status": "stopped"' in stopped, stopped
    message = stopped.split("\n", 1)[1]
    assert message.startswith("error[nvlsm-missing]: NVLink5 node: 2 ConnectX-7 Limited PF "
                              "port(s) whose VPD says SW_MNG, first 0000:c1:00.1 (15b3:1021)"), \
        message
    assert "the port has no GUID in sysfs (is mlx5_ib loaded?" in message, message
    assert "\nhint: " in message, message
    markers = second.section("b200-markers-before").split()
    assert "driver-ready" in markers and "fabricmanager-ready" not in markers, markers
    probes = _report(second.section("b200-probes-before"))
    assert probes["fabricmanager"]["exit_code"] != 0 and probes["driver-ready"]["exit_code"] == 0
    # verify on the node: not ready, the fabric not started, NVLSM named.
    verify = _json_of(second.section("b200-verify-before"), 40)
    assert not verify["ok"]
    assert verify["fabric"]["required"] and verify["fabric"]["state"] == "pending", verify
    assert [_state_and_status(g) for g in verify["gpus"]] == [("not-started", "success")]
    reasons = " ".join(verify["fabric"]["reasons"])
    assert "NVLSM is not running (no nvlsm process)" in reasons, reasons
    assert verify["gpus"][0]["cuda"]["error"] == 802


def test_a_b200_runs_nvlsm_on_the_lpf_guid_before_fabric_manager_then_is_ready(
    boots: Boots,
) -> None:
    second = boots.second
    report = _report(second.section("b200-pod-again"))
    assert report["init"][0]["exit_code"] == 0, report["init"][0]["log"]
    assert "step install-nvlsm: already satisfied" in report["init"][0]["log"]
    probes = _report(second.section("b200-probes"))
    assert {name: p["exit_code"] for name, p in probes.items()} == {
        "driver-ready": 0, "fabricmanager": 0, "persistenced": 0}
    nvlsm, fabricmanager = second.section("b200-daemons").splitlines()
    # The kit's daemons are scripts: their interpreter comes first in /proc/<pid>/cmdline.
    version_dir = f"/usr/local/nvidia/versions/{B}"
    assert nvlsm.split()[-7:] == [
        f"{version_dir}/bin/nvlsm", "--config", f"{version_dir}/share/nvidia/nvlsm/nvlsm.conf",
        "--guid", LPF_GUID, "--pid_file", "/var/run/nvidia-fabricmanager/nvlsm.pid"], nvlsm
    assert f"{version_dir}/bin/nv-fabricmanager" in fabricmanager.split(), fabricmanager
    assert fabricmanager.split()[-2:] == ["--fm-sm-mgmt-port-guid", LPF_GUID], fabricmanager
    log = second.section("b200-fm-log")
    assert_fabric_manager_started_on_nvlsm(log)
    verify = _json_of(second.section("b200-verify"), 0)
    assert verify["ok"] and verify["fabric"]["state"] == "completed", verify
    assert verify["fabric"]["reasons"] == []
    # An on-node fabric (as HGX H100's) reports no cluster UUID in the kit: no clique.
    assert verify["fabric"]["clique"] is None
    assert [_state_and_status(g) for g in verify["gpus"]] == [("completed", "success")]
    assert [g["cuda"]["ok"] for g in verify["gpus"]] == [True]
    markers = second.section("b200-markers").splitlines()
    assert f"DRIVER_VERSION={B}" in markers and "FABRIC=completed" in markers, markers
