"""`installer run --source dnf` in a booted kernel, through a DKMS stream: the guest poses as
Rocky 9.4 (its os-release, an rpm database, NVIDIA's repo and the stand-in EPEL repo from
kit.rpm, kernel-devel named for its kernel), dnf installs nvidia-driver:580-dkms into `/`, the
-dkms kmod's %post runs the kit's dkms for the running kernel, and the installer loads the
modules DKMS put in /lib/modules/<k>/extra. Two boots share one state disk:

1. cold install: modules loaded, device nodes, ld cache, `installer verify` passes;
2. reboot: `installer run` reloads with no dnf transaction and no DKMS build.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kit.rpm import V580A, build_extras, build_repo, write_repo_file
from kit.rpm.extras import base_rpm

from vm.dnf_guest import OS_RELEASE, build_kernel_repo
from vm.guest_kernel import GuestKernel
from vm.harness import FakeGpu, VmResult, boot_and_run
from vm.scripts import assert_libraries_cached, exit_of, passed_verify

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
GPUS = [FakeGpu("0000:00:04.0", "0x2330")]
INSTALL = "/home/kubernetes/bin/nvidia"
MAKE_LOG = f"/var/lib/dkms/nvidia/{V580A}/build/make.log"


def prelude(repo_file: Path) -> str:
    return f"""
export PYTHONPATH={REPO} NVIDIA_INSTALL_DIR_HOST={INSTALL} NVIDIA_DRIVER_SOURCE=dnf
export NVIDIA_DNF_REPO_URL=file://{repo_file} NVIDIA_DRIVER_VERSION={V580A}
export NVIDIA_KERNEL_MODULE_TYPE=proprietary
installer() {{ {sys.executable} -m installer "$@"; }}
step() {{ echo "@@ $1"; rc=0; shift; "$@" 2>&1 || rc=$?; echo "exit=$rc"; }}
state() {{
  echo "@@ $1"
  set +e
  grep -E '^nvidia' /proc/modules | cut -d' ' -f1 | sort
  cat /sys/module/nvidia/version
  for n in /dev/nvidia*; do stat -c '%n %F' "$n"; done
  ldconfig -p | grep -E 'libnvidia-ml.so.1|libcuda.so.1'
  set -e
}}
"""


def first_boot(repo_file: Path, repos: dict[str, Path], base: Path) -> str:
    setup = "rm -f /etc/os-release\ncat > /etc/os-release <<'EOF'\n" + OS_RELEASE + "EOF\n"
    setup += "mkdir -p /etc/yum.repos.d\n"
    for repo_id, path in repos.items():
        setup += (
            f"printf '[{repo_id}]\\nname={repo_id}\\nbaseurl=file://{path}\\nenabled=1\\n"
            f"gpgcheck=0\\n' > /etc/yum.repos.d/{repo_id}.repo\n"
        )
    return prelude(repo_file) + setup + f"""
rpm --initdb
# A Rocky host's rpm database lists its base system (bash owns /bin/sh): record the kit's base
# package there without unpacking it, so the guest keeps its own shell and tools.
rpm -i --justdb --nodeps {base}
step cold installer run
state after-cold
echo "@@ dkms"
dkms status -m nvidia -v {V580A} -k "$(uname -r)"
ls /lib/modules/"$(uname -r)"/extra
rpm -qf /lib/modules/"$(uname -r)"/extra/nvidia.ko 2>&1 || true
rpm -q --qf '%{{NAME}}\\n' -a | sort
step verify installer verify --json
"""


def second_boot(repo_file: Path) -> str:
    return prelude(repo_file) + f"""
state after-reboot
log_before=$(stat -c %Y {MAKE_LOG})
dnf_before=$(wc -l < /var/log/dnf.log)
step reboot-run installer run
state after-reboot-run
echo "@@ unchanged"
[ "$(stat -c %Y {MAKE_LOG})" = "$log_before" ] && echo "make.log unchanged"
[ "$(wc -l < /var/log/dnf.log)" = "$dnf_before" ] && echo "dnf.log unchanged"
"""


@dataclass
class Boots:
    first: VmResult
    second: VmResult


@pytest.fixture(scope="module")
def boots(vm_kernel: GuestKernel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boots]:
    # The guest sees this machine's /tmp, where the kit's repos and these files are.
    work = tmp_path_factory.mktemp("dnfvm")
    repo_file = write_repo_file(work / "cuda-rhel9.repo", f"file://{build_repo()}")
    extras = build_extras()
    repos = {
        "epel": extras / "epel",
        "appstream": build_kernel_repo(vm_kernel.release, work / "appstream"),
    }
    state = work / "state"
    script = first_boot(repo_file, repos, base_rpm(extras))
    first = boot_and_run(script, state_dir=state, gpus=GPUS, timeout=1500)
    second = boot_and_run(second_boot(repo_file), state_dir=state, gpus=GPUS, timeout=900)
    yield Boots(first, second)


def assert_loaded(section: str) -> None:
    lines = section.splitlines()
    assert {"nvidia", "nvidia_modeset", "nvidia_uvm"} <= set(lines), section
    assert V580A in lines, section
    for node in ("/dev/nvidiactl character special file", "/dev/nvidia0 character special file",
                 "/dev/nvidia-uvm character special file"):
        assert node in lines, section
    assert_libraries_cached(section, INSTALL)


def test_dkms_stream_install_loads_the_modules_dkms_built(boots: Boots) -> None:
    cold = boots.first.section("cold")
    assert exit_of(cold) == 0, cold
    assert "DKMS stream 580-dkms" in cold
    assert f"DKMS has nvidia {V580A} installed for" in cold  # %post built for the running kernel
    assert_loaded(boots.first.section("after-cold"))
    dkms = boots.first.section("dkms")
    assert re.search(rf"^nvidia/{V580A}, \S+, x86_64: installed$", dkms, re.MULTILINE), dkms
    assert "nvidia.ko" in dkms.split()  # ls of extra/
    assert "is not owned by any package" in dkms
    packages = dkms.splitlines()
    for name in ("nvidia-driver", "kmod-nvidia-latest-dkms", "dkms"):
        assert name in packages, dkms


def test_verify_passes_with_the_packages_user_space(boots: Boots) -> None:
    report = passed_verify(boots.first.section("verify"))
    assert report["driver_version"] == {"nvml": V580A, "nvidia_smi": V580A}


def test_reboot_reloads_without_dnf_or_dkms(boots: Boots) -> None:
    assert "nvidia" not in boots.second.section("after-reboot").splitlines()
    run = boots.second.section("reboot-run")
    assert exit_of(run) == 0, run
    assert "step install-driver-packages: already satisfied" in run
    assert "dkms install" not in run and not re.search(r"INFO\s+dnf: ", run)
    assert_loaded(boots.second.section("after-reboot-run"))
    unchanged = boots.second.section("unchanged").splitlines()
    assert unchanged == ["make.log unchanged", "dnf.log unchanged"]
