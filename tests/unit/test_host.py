"""installer.host against fake host trees: os-release, sysfs PCI, /proc, efivars."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lib.hosttrees import (
    A100,
    B200,
    CLASS_AUDIO,
    CLASS_BRIDGE,
    CLASS_VGA,
    H100,
    K80,
    L4,
    OS_RELEASES,
    T4,
    V100,
    add_gpus,
    add_pci_device,
    add_process,
    host_root,
    make_host,
    module_line,
    write_driver_version,
    write_known_os_release,
    write_os_release,
    write_osrelease_kernel,
    write_proc_modules,
)

from installer import host
from installer.errors import ConfigError, UnsupportedArch, UnsupportedDistro
from installer.hostroot import HostRoot

# --- distro ------------------------------------------------------------------------------

EXPECTED = {
    "ubuntu-20.04": ("ubuntu", 20, "debian"),
    "ubuntu-22.04": ("ubuntu", 22, "debian"),
    "ubuntu-24.04": ("ubuntu", 24, "debian"),
    "debian-11": ("debian", 11, "debian"),
    "debian-12": ("debian", 12, "debian"),
    "debian-13": ("debian", 13, "debian"),
    "rocky-8": ("rocky", 8, "rhel"),
    "rocky-9": ("rocky", 9, "rhel"),
    "rocky-10": ("rocky", 10, "rhel"),
    "rhel-8": ("rhel", 8, "rhel"),
    "rhel-9": ("rhel", 9, "rhel"),
    "rhel-10": ("rhel", 10, "rhel"),
    "almalinux-8": ("almalinux", 8, "rhel"),
    "almalinux-9": ("almalinux", 9, "rhel"),
    "almalinux-10": ("almalinux", 10, "rhel"),
    "ubuntu-26.04": ("ubuntu", 26, "debian"),
    "ol-8": ("ol", 8, "rhel"),
    "ol-9": ("ol", 9, "rhel"),
    "ol-10": ("ol", 10, "rhel"),
    "amzn-2023": ("amzn", 2023, "amazon"),
}


def test_every_known_distro_has_an_expectation() -> None:
    assert set(EXPECTED) == set(OS_RELEASES)


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_supported_distros(tmp_path: Path, key: str) -> None:
    write_known_os_release(tmp_path, key)
    distro = host.detect_distro(HostRoot(tmp_path))
    assert (distro.id, distro.major, distro.family) == EXPECTED[key]
    assert distro.version_id == OS_RELEASES[key][1]
    assert distro.pretty_name == OS_RELEASES[key][2]
    assert distro.source == str(tmp_path / "etc/os-release")


@pytest.mark.parametrize(
    ("distro_id", "version_id"),
    [
        ("arch", None),
        ("ubuntu", "18.04"),
        ("ubuntu", "22.10"),
        ("centos", "7"),
        ("debian", "10"),
        ("rocky", "7.9"),
        ("fedora", "40"),
        ("sles", "15.5"),
        ("", "1"),
    ],
)
def test_unsupported_distros_name_what_was_found(
    tmp_path: Path, distro_id: str, version_id: str | None
) -> None:
    write_os_release(tmp_path, distro_id, version_id)
    with pytest.raises(UnsupportedDistro) as err:
        host.detect_distro(HostRoot(tmp_path))
    message = err.value.message
    assert f"ID={distro_id or '?'}" in message
    assert f"VERSION_ID={version_id or '?'}" in message
    assert str(tmp_path / "etc/os-release") in message
    assert err.value.reference == "unsupported-distro"


def test_missing_os_release_says_the_root_may_be_wrong(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedDistro) as err:
        host.detect_distro(HostRoot(tmp_path))
    assert "root may be wrong" in err.value.message
    assert str(tmp_path) in err.value.message


def test_falls_back_to_usr_lib_os_release(tmp_path: Path) -> None:
    write_os_release(tmp_path, "debian", "12", path="usr/lib/os-release")
    distro = host.detect_distro(HostRoot(tmp_path))
    assert distro.id == "debian"
    assert distro.source == str(tmp_path / "usr/lib/os-release")


def test_os_release_absolute_symlink_stays_inside_the_root(tmp_path: Path) -> None:
    # Real hosts: /etc/os-release -> ../usr/lib/os-release, sometimes absolute.
    write_os_release(tmp_path, "rocky", "9.4", path="usr/lib/os-release")
    (tmp_path / "etc").mkdir()
    os.symlink("/usr/lib/os-release", tmp_path / "etc/os-release")
    assert host.detect_distro(HostRoot(tmp_path)).major == 9


def test_os_release_quoting_and_comments() -> None:
    text = (
        "# comment\n"
        'NAME="Rocky Linux"\n'
        "ID=rocky\n"
        "ID_LIKE='rhel centos fedora'\n"
        'VERSION_ID="9.4"\n'
        'PRETTY_NAME="Rocky Linux 9.4 (Blue \\"Onyx\\")"\n'
        "garbage line\n"
    )
    values = host.parse_os_release(text)
    assert values["ID_LIKE"] == "rhel centos fedora"
    assert values["PRETTY_NAME"] == 'Rocky Linux 9.4 (Blue "Onyx")'
    distro = host.distro_from_os_release(text, "/x")
    assert (distro.id, distro.version_id, distro.major) == ("rocky", "9.4", 9)


def test_distro_id_is_case_insensitive() -> None:
    distro = host.distro_from_os_release('ID="Ubuntu"\nVERSION_ID="24.04"\n', "/x")
    assert distro.id == "ubuntu"
    assert distro.codename == ""


# --- kernel and arch ---------------------------------------------------------------------


def test_kernel_release_from_proc(tmp_path: Path) -> None:
    write_osrelease_kernel(tmp_path, "6.8.0-1015-gcp")
    assert host.kernel_release(HostRoot(tmp_path)) == "6.8.0-1015-gcp"


def test_kernel_release_falls_back_to_uname(tmp_path: Path) -> None:
    assert host.kernel_release(HostRoot(tmp_path)) == os.uname().release


def test_kernel_override_wins(tmp_path: Path) -> None:
    write_osrelease_kernel(tmp_path, "6.8.0-1015-gcp")
    root = HostRoot(tmp_path)
    assert host.kernel_release(root, "5.14.0-427.13.1.el9_4.x86_64") == (
        "5.14.0-427.13.1.el9_4.x86_64"
    )


@pytest.mark.parametrize("bad", ["", "../../etc", "6.8.0; reboot", "a b", "-rf"])
def test_kernel_override_is_validated(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError):
        host.kernel_release(HostRoot(tmp_path), bad)


@pytest.mark.parametrize(
    ("machine", "arch"),
    [("x86_64", "x86_64"), ("amd64", "x86_64"), ("aarch64", "aarch64"), ("arm64", "aarch64")],
)
def test_arch_normalised(machine: str, arch: str) -> None:
    assert host.normalise_arch(machine) == arch


@pytest.mark.parametrize("machine", ["ppc64le", "s390x", "i686", "riscv64"])
def test_other_arches_are_unsupported(machine: str) -> None:
    with pytest.raises(UnsupportedArch) as err:
        host.normalise_arch(machine)
    assert machine in err.value.message


def test_arch_defaults_to_uname() -> None:
    assert host.normalise_arch() in ("x86_64", "aarch64")


# --- PCI ---------------------------------------------------------------------------------


def test_no_gpus(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:00:00.0", vendor=0x8086, device=0x1237, klass=0x060000)
    assert host.nvidia_gpus(HostRoot(tmp_path)) == ()


def test_no_sysfs_at_all(tmp_path: Path) -> None:
    assert host.nvidia_gpus(HostRoot(tmp_path)) == ()


def test_one_gpu_with_all_fields(tmp_path: Path) -> None:
    add_pci_device(
        tmp_path,
        "0000:00:04.0",
        device=L4,
        subsystem_vendor=0x10DE,
        subsystem_device=0x16CA,
        driver="nvidia",
    )
    (gpu,) = host.nvidia_gpus(HostRoot(tmp_path))
    assert gpu == host.PciGpu(
        address="0000:00:04.0",
        device_id=L4,
        class_code=0x030200,
        subsystem_vendor=0x10DE,
        subsystem_device=0x16CA,
        bound_driver="nvidia",
    )
    assert gpu.pci_id == "10de:27b8"


def test_eight_gpus_sorted_by_address(tmp_path: Path) -> None:
    addresses = [f"0000:{bus:02x}:00.0" for bus in (0xDB, 0x1B, 0xBB, 0x3B, 0x9B, 0x5B, 0xAB, 0x4B)]
    for address in addresses:
        add_pci_device(tmp_path, address, device=H100)
    gpus = host.nvidia_gpus(HostRoot(tmp_path))
    assert [g.address for g in gpus] == sorted(addresses)
    assert {g.device_id for g in gpus} == {H100}


def test_audio_bridge_and_other_vendors_are_ignored(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:01:00.0", device=0x2684, klass=CLASS_VGA)
    add_pci_device(tmp_path, "0000:01:00.1", device=0x22BA, klass=CLASS_AUDIO)
    add_pci_device(tmp_path, "0000:02:00.0", device=0x22A3, klass=CLASS_BRIDGE)
    add_pci_device(tmp_path, "0000:03:00.0", vendor=0x1002, device=0x740F, klass=0x038000)
    add_pci_device(tmp_path, "0000:04:00.0", vendor=0x1AF4, device=0x1000, klass=0x020000)
    gpus = host.nvidia_gpus(HostRoot(tmp_path))
    assert [(g.address, g.device_id, g.class_code) for g in gpus] == [
        ("0000:01:00.0", 0x2684, 0x030000)
    ]


def test_mixed_generations(tmp_path: Path) -> None:
    add_gpus(tmp_path, [K80, V100, T4, A100, H100, B200], with_audio=True)
    gpus = host.nvidia_gpus(HostRoot(tmp_path))
    assert [g.device_id for g in gpus] == [K80, V100, T4, A100, H100, B200]
    assert all(g.bound_driver is None for g in gpus)


def test_unreadable_device_is_skipped(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:01:00.0", device=T4)
    broken = add_pci_device(tmp_path, "0000:02:00.0", device=T4)
    (broken / "device").write_text("garbage\n")
    assert [g.address for g in host.nvidia_gpus(HostRoot(tmp_path))] == ["0000:01:00.0"]


# --- modules and the loaded driver -------------------------------------------------------


def test_proc_modules_parsing(tmp_path: Path) -> None:
    write_proc_modules(
        tmp_path,
        [
            module_line("nvidia_uvm", 4956160, 0),
            module_line("nvidia_drm", 122880, 0),
            module_line("nvidia_modeset", 1355776, 1, ["nvidia_drm"]),
            module_line("nvidia", 56799232, 2, ["nvidia_uvm", "nvidia_modeset"]),
            "ext4 1007616 1 - Live 0xffffffffc0300000",
            "weird - - - Live 0x0",
            "",
        ],
    )
    modules = host.loaded_modules(HostRoot(tmp_path))
    assert [m.name for m in modules] == [
        "nvidia_uvm",
        "nvidia_drm",
        "nvidia_modeset",
        "nvidia",
        "ext4",
    ]
    nvidia = modules[3]
    assert nvidia == host.LoadedModule("nvidia", 56799232, 2, ("nvidia_uvm", "nvidia_modeset"))
    assert nvidia.in_use
    assert modules[0].users == () and not modules[0].in_use


def test_proc_modules_with_taints_and_states() -> None:
    text = (
        "nvidia 56799232 2 nvidia_uvm,nvidia_modeset, Live 0xffffffffc1000000 (POE)\n"
        "nouveau 2818048 0 - Unloading 0x0000000000000000\n"
        "builtin_no_unload 4096 - - Live 0x0\n"
    )
    modules = host.parse_proc_modules(text)
    assert modules[0].users == ("nvidia_uvm", "nvidia_modeset")
    assert modules[1].state == "Unloading"
    assert modules[2].refcount == 0


def test_missing_proc_modules_is_empty(tmp_path: Path) -> None:
    assert host.loaded_modules(HostRoot(tmp_path)) == ()


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
@pytest.mark.parametrize(
    ("version", "flavour"),
    [("550.54.15", "proprietary"), ("550.54.15", "open"), ("470.82", "proprietary")],
)
def test_loaded_driver_both_real_formats(
    tmp_path: Path, version: str, flavour: str, arch: str
) -> None:
    write_driver_version(tmp_path, version, flavour, arch)
    driver = host.loaded_driver(HostRoot(tmp_path))
    assert driver is not None
    assert (driver.version, driver.flavour) == (version, flavour)
    assert driver.first_line.startswith("NVRM version:")


def test_real_first_lines_verbatim() -> None:
    proprietary = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"
    )
    opened = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.161.08  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Fri Feb 23 11:10:16 UTC 2024"
    )
    assert host.parse_driver_version(proprietary) == ("550.54.15", "proprietary")
    assert host.parse_driver_version(opened) == ("535.161.08", "open")
    assert host.parse_driver_version("something else") == (None, None)
    assert host.parse_driver_version("") == (None, None)


def test_no_loaded_driver(tmp_path: Path) -> None:
    assert host.loaded_driver(HostRoot(tmp_path)) is None


def test_unfamiliar_version_line_falls_back_to_sys_module(tmp_path: Path) -> None:
    write_driver_version(tmp_path, "580.82.07")
    (tmp_path / "proc/driver/nvidia/version").write_text("NVRM version: something new\n")
    driver = host.loaded_driver(HostRoot(tmp_path))
    assert driver == host.LoadedDriver("580.82.07", None, "NVRM version: something new")


# --- Secure Boot -------------------------------------------------------------------------


def _efivar(root: Path) -> Path:
    return root / host.SECURE_BOOT_EFIVAR.lstrip("/")


def test_secure_boot_on(tmp_path: Path) -> None:
    make_host(tmp_path, secure_boot=True)
    state = host.secure_boot(HostRoot(tmp_path))
    assert state.enabled is True


def test_secure_boot_off(tmp_path: Path) -> None:
    make_host(tmp_path, secure_boot=False)
    assert host.secure_boot(HostRoot(tmp_path)).enabled is False


def test_not_efi(tmp_path: Path) -> None:
    make_host(tmp_path, secure_boot=None)
    state = host.secure_boot(HostRoot(tmp_path))
    assert state.enabled is False
    assert "not EFI" in state.detail


def test_efi_without_secure_boot_variable(tmp_path: Path) -> None:
    (tmp_path / "sys/firmware/efi/efivars").mkdir(parents=True)
    assert host.secure_boot(HostRoot(tmp_path)).enabled is False


def test_efivarfs_not_mounted_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "sys/firmware/efi").mkdir(parents=True)
    assert host.secure_boot(HostRoot(tmp_path)).enabled is None


def test_unreadable_or_empty_variable_is_unknown(tmp_path: Path) -> None:
    make_host(tmp_path, secure_boot=True)
    _efivar(tmp_path).write_bytes(b"")
    assert host.secure_boot(HostRoot(tmp_path)).enabled is None
    _efivar(tmp_path).unlink()
    _efivar(tmp_path).mkdir()  # reading a directory fails like an unreadable file
    state = host.secure_boot(HostRoot(tmp_path))
    assert state.enabled is None
    assert "cannot read" in state.detail


# --- free space and holders --------------------------------------------------------------


def test_free_bytes_walks_up_to_an_existing_parent(tmp_path: Path) -> None:
    expected = os.statvfs(tmp_path)
    got = host.free_bytes(tmp_path / "not" / "yet" / "there")
    assert got > 0
    assert abs(got - expected.f_bavail * expected.f_frsize) < 64 * 1024 * 1024


def test_holders_of_dev_nvidia(tmp_path: Path) -> None:
    add_process(tmp_path, 4242, "python3", {0: "/dev/null", 7: "/dev/nvidia0", 8: "/dev/nvidiactl"})
    add_process(tmp_path, 77, "", {3: "/dev/nvidia-uvm"}, cmdline="/usr/bin/dcgm-exporter")
    add_process(tmp_path, 100, "bash", {0: "/dev/pts/0", 1: "socket:[1234]"})
    (tmp_path / "proc/self").mkdir()
    (tmp_path / "proc/999").mkdir()  # a process that exited: no fd dir
    holders = host.holders_of(HostRoot(tmp_path))
    assert holders == [
        host.Holder(77, "/usr/bin/dcgm-exporter", "/dev/nvidia-uvm"),
        host.Holder(4242, "python3", "/dev/nvidia0"),
        host.Holder(4242, "python3", "/dev/nvidiactl"),
    ]


def test_holders_with_another_prefix(tmp_path: Path) -> None:
    add_process(tmp_path, 5, "Xorg", {4: "/dev/dri/card0", 5: "/dev/nvidia0"})
    assert host.holders_of(HostRoot(tmp_path), "/dev/dri") == [
        host.Holder(5, "Xorg", "/dev/dri/card0")
    ]


def test_holders_without_proc(tmp_path: Path) -> None:
    assert host.holders_of(HostRoot(tmp_path)) == []


# --- gather ------------------------------------------------------------------------------


def test_gather_bundles_everything(tmp_path: Path) -> None:
    root = make_host(
        tmp_path / "host",
        distro="rocky-9",
        kernel="5.14.0-427.13.1.el9_4.x86_64",
        gpus=[H100] * 8,
        modules=[module_line("nouveau", 2818048, 0), module_line("drm", 700416, 1, ["nouveau"])],
        secure_boot=True,
    )
    write_driver_version(tmp_path / "host", "535.161.08", "open")
    facts = host.gather(root, free_space_path=tmp_path / "host/var/lib/nvidia", machine="x86_64")
    assert (facts.distro.id, facts.distro.family) == ("rocky", "rhel")
    assert facts.kernel_release == "5.14.0-427.13.1.el9_4.x86_64"
    assert facts.arch == "x86_64"
    assert len(facts.gpus) == 8
    assert facts.nouveau_loaded
    assert facts.module("nvidia") is None
    assert facts.loaded_driver == host.LoadedDriver(
        "535.161.08", "open", facts.loaded_driver.first_line if facts.loaded_driver else ""
    )
    assert facts.secure_boot.enabled is True
    assert facts.free_bytes > 0


def test_gather_kernel_override_and_no_nouveau(tmp_path: Path) -> None:
    root = make_host(tmp_path, modules=[module_line("nvidia-uvm".replace("-", "_"))])
    facts = host.gather(root, kernel_override="6.8.0-40-generic", free_space_path=tmp_path)
    assert facts.kernel_release == "6.8.0-40-generic"
    assert not facts.nouveau_loaded
    assert facts.module("nvidia-uvm") is not None
    assert facts.loaded_driver is None


def test_gather_on_a_big_server_finds_only_the_nvidia_gpus(tmp_path: Path) -> None:
    # Speed is a benchmark's business (bench/), never a timed assertion here.
    root = make_host(tmp_path, gpus=[H100] * 8, modules=[module_line(f"m{i}") for i in range(150)])
    for index in range(60):  # the other PCI functions of a big server
        add_pci_device(tmp_path, f"0000:{index:02x}:1f.0", vendor=0x8086, device=0x1234)
    facts = host.gather(root, free_space_path=tmp_path)
    assert len(facts.gpus) == 8
    assert all(g.pci_id.endswith("2330") for g in facts.gpus)


def test_host_root_helper_creates_the_root(tmp_path: Path) -> None:
    root = host_root(tmp_path / "new")
    assert root.root.is_dir()


def test_the_hosts_machine_is_read_under_its_root(tmp_path: Path) -> None:
    root = make_host(tmp_path, distro="ubuntu-24.04", kernel="6.8.0-1036-nvidia-64k")
    (tmp_path / "proc/sys/kernel/arch").write_text("aarch64\n")
    facts = host.gather(root, free_space_path=tmp_path)
    assert facts.arch == "aarch64"
