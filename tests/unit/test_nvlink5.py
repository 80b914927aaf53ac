"""NVLink5 nodes without processes: the Limited PF ports found by their VPD and their port GUID,
the plan's decision and the IB module step (its argv, the package a kernel lacks), what
readiness demands there, and the diagnosis of a fabric that is not complete."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from kit.nvlink5 import Cx7Port, hgx_b200_ports, vpd, write_cx7_port, write_module_tree
from lib.contexts import V, our_process
from lib.fakes import FakeRunner
from lib.hosttrees import (
    B200,
    GB200,
    add_process,
    make_host,
    module_line,
    root_env,
    write_proc_modules,
)

from installer import components, host, planner
from installer.components import fm_archive, nvlink5, nvlsm_archive
from installer.config import from_env
from installer.errors import IbModuleLoadFailed, IbModulesMissing
from installer.hostroot import HostRoot
from installer.layout import Layout

UBUNTU_KERNEL = "6.8.0-1021-aws"


def b200(root: Path, *, distro: str = "ubuntu-24.04", kernel: str = UBUNTU_KERNEL,
         ib_loaded: bool = False, gpus: Sequence[int] = (B200,) * 8,
         tree: tuple[str, ...] = ("mlx5_core", "mlx5_ib", "ib_umad")) -> HostRoot:
    host_root = make_host(root, distro=distro, kernel=kernel, gpus=gpus)
    for port in hgx_b200_ports():
        write_cx7_port(root, port, ib_loaded=ib_loaded)
    write_module_tree(root, kernel, tree)
    if ib_loaded:
        write_proc_modules(root, [module_line(n) for n in nvlink5.IB_MODULES])
    return host_root


def test_the_kits_vpd_is_well_formed_pci_vpd() -> None:
    data = vpd(True)
    assert data[0] == 0x82 and data[-1] == 0x78
    end = data.index(b"RV") + 4
    assert sum(data[:end]) & 0xFF == 0  # the RV checksum
    assert b"SW_MNG" in data and b"SW_MNG" not in vpd(False)


def test_limited_pfs_are_found_by_their_vpd_with_their_port_guid(tmp_path: Path) -> None:
    root = b200(tmp_path, ib_loaded=True)
    ports = host.lpf_ports(root)
    assert ports == (
        host.LpfPort("0000:c1:00.1", 0x1021, "mlx5_1", "0xb8cef60300e61201"),
        host.LpfPort("0000:c2:00.1", 0x1021, "mlx5_3", "0xb8cef60300e61203"))
    found = nvlink5.detect(host.lpf_ports(root))
    assert found.port == ports[0]
    assert found.reason == ("NVLink5 node: 2 ConnectX-7 Limited PF port(s) whose VPD says "
                            "SW_MNG, first 0000:c1:00.1 (15b3:1021, mlx5_1), port GUID "
                            "0xb8cef60300e61201")
    # The node GUID serves where the port has no GID yet.
    (tmp_path / "sys/devices/pci0000:c0/0000:c1:00.1/infiniband/mlx5_1/ports/1/gids/0"
     ).write_text("fe80:0000:0000:0000:0000:0000:0000:0000\n")
    assert host.lpf_ports(root)[0].guid == "0xb8cef60300e61201"


def test_the_ports_are_found_before_mlx5_ib_is_loaded(tmp_path: Path) -> None:
    root = b200(tmp_path, ib_loaded=False)
    ports = host.lpf_ports(root)
    assert [(p.address, p.ib_device, p.guid) for p in ports] == [
        ("0000:c1:00.1", None, None), ("0000:c2:00.1", None, None)]
    assert nvlink5.detect(ports).reason.endswith("port GUID known once mlx5_ib is loaded")


def test_full_pfs_and_other_nodes_are_not_nvlink5(tmp_path: Path) -> None:
    root = make_host(tmp_path, gpus=[B200])
    write_cx7_port(tmp_path, Cx7Port("0000:c1:00.0", "mlx5_0", 1, lpf=False))
    assert not nvlink5.detect(host.lpf_ports(root)).detected
    assert not nvlink5.fabric(host.fabric_hardware(root), (B200,)).needed
    assert components.fabric_required(root) == (False, ())


def test_an_nvlink5_node_needs_its_fabric_unless_managed_off_the_node(tmp_path: Path) -> None:
    root = b200(tmp_path)
    fabric = nvlink5.fabric(host.fabric_hardware(root), (B200,))
    assert fabric.needed and fabric.switches == ()
    assert components.fabric_required(root) == (True, ())
    off = nvlink5.fabric(host.fabric_hardware(root), (GB200,))
    assert not off.needed and "managed off the node" in off.reason


def plan_for(tmp_path: Path, runner: FakeRunner | None = None, **env: str) -> planner.Plan:
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=V, **env))
    return planner.make_plan(config, runner or FakeRunner(), fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)


def test_the_plan_says_nvlink5_and_loads_the_ib_modules_first(tmp_path: Path) -> None:
    b200(tmp_path)
    plan = plan_for(tmp_path)
    (said,) = [d for d in plan.decisions if d.topic == "nvlink5"]
    assert said.value == "yes"
    assert said.reason.startswith("NVLink5 node: 2 ConnectX-7 Limited PF port(s) whose VPD says "
                                  "SW_MNG, first 0000:c1:00.1 (15b3:1021)")
    assert said.reason.endswith(
        "mlx5_core, mlx5_ib, ib_umad will be loaded (modprobe); NVLSM: the nvlsm entry of "
        f"redistrib_{V}.json at https://developer.download.nvidia.com/compute/nvidia-driver/"
        "redist; its SHA-256 from that JSON when it is https on a trusted origin, else the "
        "digests file")
    (fm,) = [d for d in plan.decisions if d.topic == "fabric-manager"]
    assert fm.value == f"fabricmanager-linux-x86_64-{V}-archive.tar.xz"
    names = [s.name for s in plan.steps]
    assert names[names.index("load-ib-modules"):][:4] == [
        "load-ib-modules", "install-nvlsm", "fetch-fabricmanager", "install-fabricmanager"]


def test_the_ib_modules_are_loaded_with_the_hosts_modprobe(tmp_path: Path) -> None:
    b200(tmp_path)
    loaded: list[str] = []

    def load(argv: Sequence[str]) -> None:
        loaded.append(argv[-1])
        write_proc_modules(tmp_path, [module_line(n) for n in loaded])

    runner = FakeRunner().on("modprobe", effect=load)
    plan = plan_for(tmp_path, runner)
    (step,) = [s for s in plan.steps if s.name == "load-ib-modules"]
    assert not step.is_satisfied()
    step.apply()
    assert step.is_satisfied()
    modprobes = [a for a in runner.argvs() if "modprobe" in a]
    config_dir = str(tmp_path / "etc/modprobe.d")
    assert modprobes == [["modprobe", "-d", str(tmp_path), "-C", config_dir, name]
                         for name in ("mlx5_core", "mlx5_ib", "ib_umad")]


def test_modules_built_into_the_kernel_count_as_loaded(tmp_path: Path) -> None:
    b200(tmp_path, tree=("ib_umad",))
    (tmp_path / f"lib/modules/{UBUNTU_KERNEL}/modules.builtin").write_text(
        "kernel/drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko\n"
        "kernel/drivers/infiniband/hw/mlx5/mlx5_ib.ko\n")
    assert nvlink5.not_loaded(HostRoot(tmp_path), UBUNTU_KERNEL) == [
        "ib_umad"]


@pytest.mark.parametrize(("distro", "kernel", "package"), [
    ("ubuntu-24.04", UBUNTU_KERNEL, f"linux-modules-extra-{UBUNTU_KERNEL}"),
    ("debian-12", "6.1.0-56-amd64", "linux-image-6.1.0-56-amd64"),
    ("rocky-9", "5.14.0-427.13.1.el9_4.x86_64", "kernel-modules-5.14.0-427.13.1.el9_4.x86_64"),
])
def test_a_kernel_without_the_ib_modules_is_refused_naming_its_package(
        tmp_path: Path, distro: str, kernel: str, package: str) -> None:
    # EKS's Ubuntu image: mlx5_core is in linux-modules, mlx5_ib and ib_umad are not.
    b200(tmp_path, distro=distro, kernel=kernel, tree=("mlx5_core",))
    runner = FakeRunner()
    plan = plan_for(tmp_path, runner, NVIDIA_DRIVER_SOURCE="runfile")
    (said,) = [d for d in plan.decisions if d.topic == "nvlink5"]
    assert (f"mlx5_ib, ib_umad missing from /lib/modules/{kernel}: install {package} (run "
            "fails with ib-modules-missing); NVLSM: " in said.reason)
    (step,) = [s for s in plan.steps if s.name == "load-ib-modules"]
    with pytest.raises(IbModulesMissing) as caught:
        step.apply()
    assert caught.value.exit_code == 54
    assert f"/lib/modules/{kernel} has no mlx5_ib, ib_umad" in caught.value.message
    assert caught.value.hint.startswith(f"Install {package} on the node")
    assert not [a for a in runner.argvs() if "modprobe" in a]  # nothing loaded half-way


def test_a_module_modprobe_refuses_is_a_clear_error(tmp_path: Path) -> None:
    b200(tmp_path)
    runner = FakeRunner().on("modprobe", returncode=1,
                             output="modprobe: ERROR: could not insert 'mlx5_core': "
                             "Key was rejected by service")
    (step,) = [s for s in plan_for(tmp_path, runner).steps if s.name == "load-ib-modules"]
    with pytest.raises(IbModuleLoadFailed, match=r"modprobe mlx5_core exited 1: .*Key was "
                       r"rejected") as caught:
        step.apply()
    assert caught.value.exit_code == 55


def test_nothing_is_loaded_where_fabric_manager_is_the_hosts(tmp_path: Path) -> None:
    b200(tmp_path)
    plan = plan_for(tmp_path, NVIDIA_FABRICMANAGER="false")
    assert "load-ib-modules" not in [s.name for s in plan.steps]
    (said,) = [d for d in plan.decisions if d.topic == "nvlink5"]
    assert said.value == "off"


def test_elsewhere_the_plan_says_no_nvlink5(tmp_path: Path) -> None:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", gpus=[B200])
    plan = plan_for(tmp_path)
    (said,) = [d for d in plan.decisions if d.topic == "nvlink5"]
    assert said.value == "no" and "SW_MNG" in said.reason
    assert "load-ib-modules" not in [s.name for s in plan.steps]


def test_the_diagnosis_names_what_an_nvlink5_fabric_lacks(tmp_path: Path) -> None:
    root = b200(tmp_path, ib_loaded=True)
    (tmp_path / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text(UBUNTU_KERNEL + "\n")
    write_proc_modules(tmp_path, [module_line("mlx5_core")])
    said = nvlink5.diagnose(root)
    assert said is not None and said.endswith(
        "mlx5_ib, ib_umad not loaded, so NVLSM cannot bind the port (install the kernel's "
        "InfiniBand modules; `installer plan` names the package)")
    write_proc_modules(tmp_path, [module_line(n) for n in nvlink5.IB_MODULES])
    assert (nvlink5.diagnose(root) or "").endswith(
        "NVLSM is not running (no nvlsm process); Fabric Manager cannot route the NVLink5 "
        "fabric without it (the fabricmanager container starts both)")
    other = add_process(tmp_path, 4242, "nvlsm-exporter", {},
                        cmdline="/opt/nvlsm/bin/nvlsm-exporter")
    os.symlink("/opt/nvlsm/bin/nvlsm-exporter", other / "exe")
    assert "NVLSM is not running" in (nvlink5.diagnose(root) or "")
    assert nvlink5.COMPONENT.fabric_reasons(root, []) == [nvlink5.diagnose(root)]
    our_process(tmp_path, 4243, "/var/lib/nvidia", "nvlsm", script=True)  # the kit's stand-in
    assert nvlink5.diagnose(root) is None
    assert nvlink5.COMPONENT.fabric_reasons(root, []) == []
    assert nvlink5.diagnose(make_host(tmp_path / "other", gpus=[B200])) is None


def test_the_kit_links_sysfs_as_the_kernel_does(tmp_path: Path) -> None:
    b200(tmp_path, ib_loaded=True)
    link = tmp_path / "sys/class/infiniband/mlx5_1"
    assert os.path.realpath(link / "device") == str(
        tmp_path / "sys/devices/pci0000:c0/0000:c1:00.1")
    assert b"SW_MNG" in (link / "device/vpd").read_bytes()


def install_fabric_manager(layout: Layout, cfg: str = "FABRIC_MODE=0\n") -> None:
    """Fabric Manager of version V as a run leaves it in the install dir (an empty binary)."""
    share = fm_archive.config_dir(layout, V)
    share.mkdir(parents=True)
    (share / "fabricmanager.cfg").write_text(cfg)
    (share / fm_archive.INSTALLED_MARKER).write_text(f"{V}\n{'0' * 64}\n")
    fm_archive.binary(layout, V).parent.mkdir(parents=True)
    fm_archive.binary(layout, V).write_text("")


def install_nvlsm(layout: Layout) -> None:
    """NVLSM beside it (after install_fabric_manager, whose bin directory it shares)."""
    nvlsm_archive.binary(layout, V).write_text("")
    nvlsm_archive.share_dir(layout, V).mkdir(parents=True)
    (nvlsm_archive.share_dir(layout, V) / nvlsm_archive.INSTALLED_MARKER).write_text(
        f"2025.10.12\n{'0' * 64}\n")


@pytest.mark.parametrize(("mode", "resets"), [("1", 1), ("0", 0), (None, 0)])
def test_shared_nvswitch_mode_resets_the_gpus_once_fabric_manager_is_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str | None, resets: int) -> None:
    from installer import verify
    from installer.components import fabricmanager_daemon
    from installer.components.supervisor import Driver

    root = make_host(tmp_path, gpus=[B200])
    config = from_env(root_env(tmp_path))
    layout = Layout.from_config(config, root)
    install_fabric_manager(layout, "LOG_LEVEL=4\nFABRIC_MODE=0\n")
    from kit.fabric import FakeSwitch, write_pci_switch

    write_pci_switch(tmp_path / "sys/bus/pci/devices", FakeSwitch("0000:05:00.0"))
    env = {} if mode is None else {"NVFM_CONFIG_FABRIC_MODE": mode}
    daemon = fabricmanager_daemon.FabricManagerDaemon(config, root, env=env)
    runner = FakeRunner().on(str(layout.bin_dir / "nvidia-smi"), "-r",
                             output="GPU 00000000:20:00.0 was successfully reset.")
    daemon.commands = runner
    monkeypatch.setattr(verify, "nvml_gpus", lambda *a: ([], []))
    try:
        start = daemon.plan(Driver(V, layout.install_host))
        assert callable(start)
        monkeypatch.setattr(fabricmanager_daemon.runner, "spawn", lambda *a, **k: object())
        start()
        assert daemon.ready(object()) is None  # not configured yet: nothing reset
        daemon._line(fabricmanager_daemon.CONFIGURED)
        daemon.ready(object())
        daemon.ready(object())
    finally:
        daemon.close()
    assert runner.argvs() == [[str(layout.bin_dir / "nvidia-smi"), "-r"]] * resets
    # The container's ld cache does not know the install dir: its libnvidia-ml is named.
    assert all(call.env == {"LD_LIBRARY_PATH": str(layout.version_dir(V) / "lib64")}
               for call in runner.calls)


def test_on_nvlink5_shared_mode_resets_once_nvml_shows_the_gpus_registering(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVLink5's Fabric Manager log is not documented: the reset waits for NVML to show the
    GPUs taken in hand (in progress), not for the first poll after the start."""
    from installer import verify
    from installer.components import fabricmanager_daemon, nvlsm
    from installer.components.supervisor import Driver
    from installer.verify import GpuInfo

    root = b200(tmp_path, ib_loaded=True)
    config = from_env(root_env(tmp_path))
    layout = Layout.from_config(config, root)
    install_fabric_manager(layout)
    install_nvlsm(layout)
    states = ["not-started"]

    def answer(*args: object) -> tuple[list[GpuInfo], list[str]]:
        return [GpuInfo(0, "NVIDIA B200", "GPU-0", "0000:18:00.0", 183359,
                        fabric_state=states[0], fabric_status="success")], []

    monkeypatch.setattr(verify, "nvml_gpus", answer)
    monkeypatch.setattr(nvlsm, "pair_start", lambda *a, **k: (lambda: object()))
    daemon = fabricmanager_daemon.FabricManagerDaemon(
        config, root, env={"NVFM_CONFIG_FABRIC_MODE": "1"})
    daemon.wait.every = 0
    runner = FakeRunner().on(str(layout.bin_dir / "nvidia-smi"), "-r", output="reset")
    daemon.commands = runner
    try:
        start = daemon.plan(Driver(V, layout.install_host))
        assert callable(start)
        start()
        assert daemon.ready(object()) is None and daemon.ready(object()) is None
        assert runner.argvs() == []  # Fabric Manager has not taken the GPUs yet
        states[0] = "in-progress"
        daemon.ready(object())  # NVML now says in progress
        daemon.ready(object())  # so the reset runs
        daemon.ready(object())
    finally:
        daemon.close()
    assert runner.argvs() == [[str(layout.bin_dir / "nvidia-smi"), "-r"]]


def test_on_nvlink5_nvml_alone_says_when_fabric_manager_is_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fabric Manager's NVLink5 log lines are not documented: the completed fabric decides."""
    from installer import verify
    from installer.components import fabricmanager_daemon
    from installer.components.supervisor import Driver

    root = b200(tmp_path, ib_loaded=True)
    config = from_env(root_env(tmp_path))
    layout = Layout.from_config(config, root)
    install_fabric_manager(layout)
    install_nvlsm(layout)
    monkeypatch.setattr(verify, "nvml_gpus", lambda *a: ([], []))
    daemon = fabricmanager_daemon.FabricManagerDaemon(config, root, env={})
    try:
        assert callable(daemon.plan(Driver(V, layout.install_host)))
        said = daemon.ready(object())
    finally:
        daemon.close()
    assert said is not None and said.startswith("DRIVER_VERSION=")
    # Without NVLSM installed the container says what is missing.
    (nvlsm_archive.share_dir(layout, V) / nvlsm_archive.INSTALLED_MARKER).unlink()
    from installer.errors import NvlsmMissing

    other = fabricmanager_daemon.FabricManagerDaemon(config, root, env={})
    try:
        with pytest.raises(NvlsmMissing, match=r"bin/nvlsm \(NVLSM installed with driver"):
            other.plan(Driver(V, layout.install_host))
    finally:
        other.close()


@pytest.mark.parametrize(("distro", "kernel", "pin", "said"), [
    ("rocky-9", "5.14.0-427.13.1.el9_4.x86_64", "",
     "NVLSM: NVIDIA's package nvlsm (the host's, else the repo's newest) from the host's NVIDIA "
     "repo (signed, as the driver's), its files into versions/<ver>/"),
    ("rocky-9", "5.14.0-427.13.1.el9_4.x86_64", "2025.06.6",
     "NVLSM: NVIDIA's package nvlsm-2025.06.6 (NVIDIA_NVLSM_VERSION) from the host's NVIDIA "
     "repo (signed, as the driver's), its files into versions/<ver>/"),
    # EL10 has no module profiles: no Fabric Manager of ours there, so no NVLSM either.
    ("rocky-10", "6.12.0-55.9.1.el10_0.x86_64", "",
     "NVLSM is not installed by the installer on this source, so the fabricmanager "
     "container fails with nvlsm-missing: set NVIDIA_FABRICMANAGER=false and run NVIDIA's "
     "nvlsm package and Fabric Manager of the driver's version on the host"),
])
def test_on_dnf_hosts_the_plan_says_where_nvlsm_comes_from(
    tmp_path: Path, distro: str, kernel: str, pin: str, said: str
) -> None:
    import dataclasses

    b200(tmp_path, distro=distro, kernel=kernel)
    plan = plan_for(tmp_path, NVIDIA_DRIVER_SOURCE="runfile", NVIDIA_NVLSM_VERSION=pin)
    from installer import sources

    dnf = sources.named("dnf")  # its answer: who ships NVLSM there
    distro = plan.context.facts.distro
    ctx = dataclasses.replace(plan.context, target=dataclasses.replace(
        plan.context.target,
        ships_user_space=lambda component: dnf.ships_user_space(component, distro)))
    assert nvlink5.COMPONENT.decision(ctx).reason.endswith(said)
