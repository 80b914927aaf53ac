"""An HGX B200 node in a booted kernel (one boot, tests/vm/b200.py): the kit's nvidia.ko with
two B200 GPUs, the board's ConnectX-7 functions (a Limited PF with SW_MNG in its VPD) in the
guest's PCI tree, and mlx5_core, mlx5_ib and ib_umad as real (empty) kbuild modules. What
`installer fabricmanager` (the fabricmanager container's command) and `installer verify` do:
without the IB modules verify names them; without NVLSM delivered the container ends in
nvlsm-missing, writes no readiness file and verify says NVLSM is not running; an NVLSM that
cannot open ib_umad's interface never gets a Fabric Manager and the container gives up with
fabricmanager-failed quoting NVLSM's error; once NVLSM can run it starts on the LPF's port
GUID, Fabric Manager after its socket on the same GUID, the GPUs' fabric completes, the
readiness file appears and verify passes with CUDA; SIGTERM stops both and takes the readiness
file."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from vm.b200 import (
    BOARD,
    DELIVER_NVLSM,
    DRIVER,
    IB,
    IB_UP,
    LPF_GUID,
    STATE,
    VERSION,
    assert_fabric_manager_started_on_nvlsm,
    prepare,
)
from vm.guest_kernel import GuestKernel
from vm.harness import VmResult, boot_and_run

pytestmark = pytest.mark.vm

# verify --json's lines a test reads: ok, the node's fabric state, each GPU's fabric and CUDA
# result, then the problems.
SHOW = (r'import json, sys; d = json.load(open(sys.argv[1])); '
        r'print(d["ok"], d["fabric"].get("state")); '
        r'print(*[(g["fabric"]["state"], g["cuda"]["ok"]) for g in d["gpus"]]); '
        r'print(*d["problems"], sep="\n")')

SCRIPT = DRIVER + f"""
show() {{ {sys.executable} -c '{SHOW}' "$1"; }}
echo "@@ verify-no-ib-modules"
installer verify --json > /tmp/no-ib.json 2>/dev/null || echo "exit $?"
show /tmp/no-ib.json
""" + IB_UP + f"""
echo "@@ ib-modules"; grep -E '^(mlx5_core|mlx5_ib|ib_umad) ' /proc/modules | cut -d' ' -f1
echo "@@ fabricmanager-without-nvlsm"
NVIDIA_INSTALLER_FABRIC_TIMEOUT=5 installer fabricmanager 2>/tmp/fm.log || echo "exit $?"
grep '^error\\[' /tmp/fm.log || true
ls {STATE}
echo "@@ verify-without-nvlsm"
installer verify --json > /tmp/no-nvlsm.json 2>/dev/null || echo "exit $?"
show /tmp/no-nvlsm.json
""" + DELIVER_NVLSM + f"""
echo "@@ nvlsm-cannot-start"
mv /sys/class/infiniband_mad /run/umad-aside  # as if ib_umad had gone
NVIDIA_INSTALLER_DAEMON_RESTARTS=1 installer fabricmanager 2>/tmp/fm-fail.log || echo "exit $?"
sed -n '/^error\\[/,$p' /tmp/fm-fail.log
grep -c 'Fabric Manager version' /tmp/fm-fail.log || true
ls -1 {STATE}
mv /run/umad-aside /sys/class/infiniband_mad
# The container's command itself in the background (a shell function would take the SIGTERM).
{sys.executable} -m installer fabricmanager 2>/tmp/fm2.log &
for _ in $(seq 90); do test -f {STATE}/fabricmanager-ready && break; sleep 1; done
echo "@@ fabricmanager-ready"; cat {STATE}/fabricmanager-ready
echo "@@ daemons"
for d in bin/nvlsm bin/nv-fabricmanager; do
  tr '\\0' ' ' < /proc/$(pgrep -f "versions/{VERSION}/$d " | head -1)/cmdline || true; echo
done
echo "@@ verify-completed"
installer verify --json > /tmp/completed.json 2>/dev/null || echo "exit $?"
show /tmp/completed.json
echo "@@ stopped"
kill $!; wait $! || echo "exit $?"
pgrep -f "versions/{VERSION}/bin/n" || echo "no daemon"
ls -A /var/run/nvidia-fabricmanager {STATE} || true
echo '@@ fm-log'; cat /tmp/fm2.log
"""


@pytest.fixture(scope="module")
def node(vm_kernel: GuestKernel, kernel_build_dir: Path,
         tmp_path_factory: pytest.TempPathFactory) -> VmResult:
    files = prepare(tmp_path_factory.mktemp("b200"), kernel_build_dir)
    result = boot_and_run(SCRIPT, gpus=BOARD, timeout=600, kernel=vm_kernel.release,
                          files=files)
    assert result.exit_code == 0, result.console
    return result


def test_without_the_ib_modules_verify_names_them(node: VmResult) -> None:
    section = node.section("verify-no-ib-modules")
    assert section.splitlines()[:2] == ["exit 40", "False pending"], section
    assert "mlx5_core, mlx5_ib, ib_umad not loaded, so NVLSM cannot bind the port" in section
    assert set(node.section("ib-modules").split()) == set(IB)


def test_without_nvlsm_the_node_is_not_ready(node: VmResult) -> None:
    section = node.section("fabricmanager-without-nvlsm")
    assert section.splitlines()[:2] == [
        "exit 58", "error[nvlsm-missing]: NVLink5 node: 2 ConnectX-7 Limited PF port(s) whose "
        f"VPD says SW_MNG, first 0000:c1:00.1 (15b3:1021, mlx5_1), port GUID {LPF_GUID}, but "
        f"/run/inst/versions/{VERSION}/bin/nvlsm (NVLSM installed with driver {VERSION}) is not "
        "there"], section
    assert section.splitlines()[-1:] == ["driver-ready"], section  # no fabricmanager-ready
    verify = node.section("verify-without-nvlsm")
    assert verify.splitlines()[:2] == ["exit 40", "False pending"], verify
    assert "NVLSM is not running (no nvlsm process)" in verify, verify


def test_an_nvlsm_that_cannot_start_never_gets_a_fabric_manager(node: VmResult) -> None:
    error, tail, *rest = node.section("nvlsm-cannot-start").splitlines()[1:]
    assert node.section("nvlsm-cannot-start").splitlines()[0] == "exit 98"
    assert error == ("error[fabricmanager-failed]: fabricmanager exited 2 times within 10 "
                     "minutes (last exit status 1); not restarting it again; its last lines:")
    assert re.fullmatch(r"nvlsm: .* \[nvlsm\] ERR: umad_init: cannot open the user MAD "
                        r"interface \(is ib_umad loaded\?\)", tail), tail
    # No Fabric Manager was started, and no readiness file written.
    assert rest[-3:] == ["0", "driver-ready", "fabricmanager-restarts"], rest


def test_with_nvlsm_first_on_the_lpf_guid_the_fabric_completes(node: VmResult) -> None:
    ready = node.section("fabricmanager-ready").splitlines()
    assert f"DRIVER_VERSION={VERSION}" in ready and "FABRIC=completed" in ready, ready
    # Fabric Manager was started only once NVLSM's socket was there.
    log = node.section("fm-log")
    assert_fabric_manager_started_on_nvlsm(log)
    nvlsm, fabricmanager = node.section("daemons").splitlines()
    assert nvlsm.split()[-4:] == ["--guid", LPF_GUID, "--pid_file",
                                    "/var/run/nvidia-fabricmanager/nvlsm.pid"], nvlsm
    assert fabricmanager.split()[-2:] == ["--fm-sm-mgmt-port-guid", LPF_GUID], fabricmanager
    verify = node.section("verify-completed").splitlines()
    assert verify[:2] == ["True completed", "('completed', True) ('completed', True)"], verify


def test_sigterm_stops_both_daemons_and_takes_the_readiness_file(node: VmResult) -> None:
    stopped = node.section("stopped").splitlines()
    # The container's command returns once both are down (the order: test_nvlsm.py).
    assert stopped[0] == "no daemon", stopped
    assert "fm_sm_ipc.socket" not in stopped and "nvlsm.pid" not in stopped, stopped
    log = node.section("fm-log")
    assert "Fabric Manager received a termination signal, exiting" in log, log[-3000:]
    assert "[nvlsm] received a termination signal, exiting" in log, log[-3000:]
    assert "fabricmanager-ready" not in stopped
