"""`installer run` end to end on an arm64 node, in one TCG boot of Debian's real arm64 kernel on
an arm64 Debian root (tests/vm/arm64_node.py): modules cross-built on this x86 machine by
`installer prebuild --arch aarch64 --push`, pulled from a real registry on this machine.

First NVIDIA's real arm64 535.261.03 modules: the kernel takes them, they find no GPU, and the
installer fails with the clear `module-load-failed`, leaving the node as it was. Then the kit's
aarch64 .run (its modules, its aarch64 libnvidia-ml, libcuda and nvidia-smi) on that same
node: install, load, device nodes, the real arm64 ldconfig, verify, and a warm re-run that
changes nothing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.builder import build_runfile, runfile_name
from kit.digests import write_digests
from kit.real_parts import PartsMissing
from lib.arm64kit import KERNEL, arm64, arm64_run, publish, publish_kit
from lib.httpfaults import serve_directory
from lib.realdriver import VERSION
from lib.registrykit import PASSWORD, USER, Registry, make_key_pair

from vm import arm64_node, arm64_root
from vm.arm64_guest import QEMU
from vm.harness import VmResult
from vm.scripts import exit_of

pytestmark = pytest.mark.vm

KIT = "580.105.08"
INSTALL = "/home/kubernetes/bin/nvidia"
REPOSITORY_PATH = "fleet/nvidia-modules"
MODULE_LOAD_FAILED = 35
GUEST_HOST = "10.0.2.2"  # this machine's 127.0.0.1 as qemu's user network shows it

SCENARIO = """
docker-registry serve /vm/registry/config.yml >/tmp/registry.log 2>&1 &
until (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; do sleep 0.5; done
export PYTHONPATH={python_path}
export NVIDIA_INSTALL_DIR_HOST={install} NVIDIA_DRIVER_MIRRORS={mirror}
export NVIDIA_DRIVER_DIGESTS_FILE=/vm/digests NVIDIA_INSTALLER_FETCH_HEADERS=false
export NVIDIA_MODULE_REGISTRY={registry} NVIDIA_MODULE_REGISTRY_PLAIN_HTTP=true
export NVIDIA_MODULE_REGISTRY_USERNAME={user} NVIDIA_MODULE_REGISTRY_PASSWORD={password}
export NVIDIA_MODULE_TRUSTED_KEYS=/vm/publisher.pub
K=$(uname -r)
step() {{ echo "@@ $1"; rc=0; shift; "$@" 2>&1 || rc=$?; echo "exit=$rc"; }}
snapshot() {{
    # What an install changes on the host, beside the install dir (listed on its own).
    echo "@@ $1"
    ls -A /etc/ld.so.conf.d /run 2>&1
    find /lib/firmware -path '*/nvidia*' 2>/dev/null || true
    find /lib/modules/$K -path '*/updates*'
    echo "modules.dep entries under updates/: $(grep -c updates/ /lib/modules/$K/modules.dep)"
    echo "loaded:" $(grep -o '^nvidia[a-z_]*' /proc/modules | sort)
    echo "@@ $1-install-dir"
    ls -A {install} 2>&1 || true
}}
fingerprint() {{
    # .installer.lock is the run's lock, taken by every run: not what the run installs.
    find {install} /lib/modules/$K /lib/firmware /etc/ld.so.conf.d /etc/ld.so.cache \\
        /dev/nvidia* /run/nvidia-driver-installer -printf '%p %s %m %T@\\n' 2>/dev/null \\
        | grep -v '/.installer.lock ' | sort
}}
echo "@@ machine"
uname -m
uname -r
snapshot before-real
step real env NVIDIA_DRIVER_VERSION={real} NVIDIA_KERNEL_MODULE_TYPE=proprietary \\
    python3 -m installer run
echo "@@ real-kernel"
dmesg -t | grep -E 'NVRM|nvidia' || true
snapshot after-real
export NVIDIA_DRIVER_VERSION={kit} NVIDIA_KERNEL_MODULE_TYPE=open
step run python3 -m installer run
echo "@@ modules"
cut -d' ' -f1 /proc/modules | grep nvidia | sort
echo "@@ proc-version"
cat /proc/driver/nvidia/version
echo "@@ devices"
ls -l /dev/nvidia* | sort
echo "@@ ld-cache"
ldconfig -p | grep -E 'libnvidia-ml|libcuda'
step verify python3 -m installer verify --json
fingerprint > /tmp/before-warm
step warm python3 -m installer run
echo "@@ warm-changes"
fingerprint | diff /tmp/before-warm - && echo "nothing changed" || true
"""


def node_registry(registry: Registry, work: Path) -> Path:
    """The registry as the node serves it to itself: the same storage, config and port, run by
    Debian's arm64 docker-registry on the node's 127.0.0.1. A signature names the repository
    it was pushed to (127.0.0.1:<port>/...) and the node refuses it under any other name, so
    the node cannot reach this machine's registry as 10.0.2.2 (the mirror it can: a digests
    file vouches for the .run, whatever its address)."""
    copy = work / "registry"
    shutil.copytree(registry.workdir, copy, ignore=shutil.ignore_patterns("registry.log"))
    config = copy / "config.yml"
    config.write_text(config.read_text().replace(str(registry.workdir), "/vm/registry"))
    return copy


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmResult]:
    if shutil.which(QEMU) is None:
        pytest.fail(f"{QEMU} is not installed (scripts/install-deps: qemu-system-arm)")
    parts = arm64()
    try:
        arm64_root.require()
    except PartsMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    www = tmp_path_factory.mktemp("www")
    build_runfile(KIT, www / KIT, arch="aarch64")
    real = arm64_run(tmp_path_factory)
    (www / VERSION).mkdir()
    for name in (real.name, f"{real.name}.sha256sum"):
        shutil.copyfile(real.parent / name, www / VERSION / name)
    write_digests(www / "digests", www)
    private, public = make_key_pair(tmp_path_factory.mktemp("publisher"))
    registry = Registry(tmp_path_factory.mktemp("registry")).start()
    try:
        settings = {"NVIDIA_MODULE_REGISTRY": registry.repository(REPOSITORY_PATH),
                    "NVIDIA_MODULE_REGISTRY_PLAIN_HTTP": "true",
                    "NVIDIA_MODULE_REGISTRY_USERNAME": USER,
                    "NVIDIA_MODULE_REGISTRY_PASSWORD": PASSWORD,
                    "NVIDIA_MODULE_PUBLISHER_KEY": str(private)}
        kit = publish_kit(tmp_path_factory, KIT, "open", www / KIT / runfile_name(KIT, "aarch64"),
                          **settings)
        assert kit.returncode == 0, kit.stderr[-4000:]
        pushed = publish(tmp_path_factory, "proprietary", **settings)
        assert pushed.returncode == 0, pushed.stderr[-4000:]
        with serve_directory(www) as (base, _requests):
            scenario = SCENARIO.format(
                python_path="/opt/installer", install=INSTALL,
                mirror=base.replace("127.0.0.1", GUEST_HOST),
                registry=registry.repository(REPOSITORY_PATH), port=registry.port, user=USER,
                password=PASSWORD, real=VERSION, kit=KIT)
            work = tmp_path_factory.mktemp("arm64-node")
            files = {"digests": www / "digests", "publisher.pub": public,
                     "registry": node_registry(registry, work)}
            disk, _ = arm64_node.build_root(parts, scenario, files, work)
            result = arm64_node.boot(parts, disk, work)
            disk.unlink()
    finally:
        registry.stop()
    assert result.exit_code == 0, result.console[-5000:]
    yield result


def test_the_node_is_debians_arm64_kernel(node: VmResult) -> None:
    assert node.section("machine").split() == ["aarch64", KERNEL]


def test_nvidias_real_arm64_modules_from_the_registry_find_no_gpu(node: VmResult) -> None:
    run = node.section("real")
    assert exit_of(run) == MODULE_LOAD_FAILED, run
    assert "error[module-load-failed]" in run
    assert "NVRM: No NVIDIA GPU found." in run
    assert "Traceback" not in run
    assert "NVRM: No NVIDIA GPU found." in node.section("real-kernel")


def test_the_refused_install_leaves_the_node_as_it_was(node: VmResult) -> None:
    assert "put back: " in node.section("real") or "rolled back: " in node.section("real")
    assert node.section("after-real") == node.section("before-real")
    assert "loaded:" in node.section("after-real").splitlines()  # no nvidia module
    # The download and extraction caches may stay (a retry reuses them); no activation does.
    left = node.section("after-real-install-dir").split()
    for name in ("current", "bin", "lib64", "drivers", "state.json", ".cache"):
        assert name not in left, left


def test_the_kit_driver_installs_end_to_end_from_the_registry(node: VmResult) -> None:
    run = node.section("run")
    assert exit_of(run) == 0, run
    assert "using prebuilt modules" in run
    assert set(node.section("modules").split()) >= {"nvidia", "nvidia_uvm", "nvidia_modeset"}
    assert f"Open Kernel Module for aarch64  {KIT}  " in node.section("proc-version")
    devices = node.section("devices")
    for name in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"):
        assert name in devices, devices
    cache = node.section("ld-cache")
    assert "libnvidia-ml.so.1 (libc6,AArch64)" in cache, cache
    assert f"{INSTALL}/" in cache


def test_verify_passes_and_reports_aarch64(node: VmResult) -> None:
    verify = node.section("verify")
    assert exit_of(verify) == 0, verify
    report = json.loads(verify[verify.index("{"):verify.rindex("}") + 1])
    assert report["architecture"] == "aarch64"
    assert report["driver_version"] == {"nvml": KIT, "nvidia_smi": KIT}
    assert report["cuda"]["ok"] is True
    assert [gpu["pci_bus_id"] for gpu in report["gpus"]] == report["expected_gpus"]


def test_a_warm_rerun_changes_nothing(node: VmResult) -> None:
    warm = node.section("warm")
    assert exit_of(warm) == 0, warm
    assert node.section("warm-changes") == "nothing changed"

