"""The per-family answers for the hosts of 2026 without a process: headers package names of every
kernel line and flavour, the nearest supported release, arm64 page sizes from a kernel's config,
the gcc of Ubuntu 26.04's /proc/version, and the dnf source's kernel packages."""

from __future__ import annotations

from pathlib import Path

import pytest
from lib.dnfplans import add_repo_file, decision, plan_for
from lib.fakes import FakeRunner
from lib.hosttrees import make_host, write_os_release

from installer import distros, host
from installer.errors import UnsupportedDistro
from installer.headers import compiler
from installer.host.pagesize import from_config, kernel_page_size
from installer.hostroot import HostRoot
from installer.sources.dnf import commands as dnf_commands


@pytest.mark.parametrize(("distro_id", "version_id", "kernel", "package", "flavour", "tag"), [
    # Ubuntu keeps the whole release, flavour included, in linux-headers-<release>.
    ("ubuntu", "24.04", "6.8.0-1036-nvidia-64k", "linux-headers-6.8.0-1036-nvidia-64k",
     "nvidia-64k", "ubuntu24.04"),
    ("ubuntu", "24.04", "6.8.0-87-generic-64k", "linux-headers-6.8.0-87-generic-64k",
     "generic-64k", "ubuntu24.04"),
    ("ubuntu", "26.04", "7.0.0-1004-nvidia-64k", "linux-headers-7.0.0-1004-nvidia-64k",
     "nvidia-64k", "ubuntu26.04"),
    ("ubuntu", "24.04", "6.17.0-1011-azure", "linux-headers-6.17.0-1011-azure", "azure",
     "ubuntu24.04"),
    # Oracle: UEK's kernel-uek-devel, RHCK's kernel-devel; one image per EL major.
    ("ol", "9.6", "6.12.0-105.51.5.el9uek.x86_64", "kernel-uek-devel-6.12.0-105.51.5.el9uek"
     ".x86_64", "uek", "rocky9"),
    ("ol", "8.10", "4.18.0-553.el8_10.x86_64", "kernel-devel-4.18.0-553.el8_10.x86_64",
     "default", "rocky8"),
    # RHEL's 64k kernel: kernel-64k-devel of the 4k kernel's version.
    ("rhel", "9.5", "5.14.0-503.15.1.el9_5.aarch64+64k",
     "kernel-64k-devel-5.14.0-503.15.1.el9_5.aarch64", "64k", "rocky9"),
    ("almalinux", "10.0", "6.12.0-55.9.1.el10_0.aarch64+64k",
     "kernel-64k-devel-6.12.0-55.9.1.el10_0.aarch64", "64k", "rocky10"),
    # Amazon Linux 2023: `kernel` for 6.1, its own package per later line.
    ("amzn", "2023", "6.1.147-172.266.amzn2023.x86_64",
     "kernel-devel-6.1.147-172.266.amzn2023.x86_64", "kernel", "rocky9"),
    ("amzn", "2023", "6.12.40-63.114.amzn2023.x86_64",
     "kernel6.12-devel-6.12.40-63.114.amzn2023.x86_64", "kernel6.12", "rocky9"),
    ("amzn", "2023", "6.18.35-68.127.amzn2023.aarch64",
     "kernel6.18-devel-6.18.35-68.127.amzn2023.aarch64", "kernel6.18", "rocky9"),
])
def test_each_host_names_its_headers_package_flavour_and_image(
        tmp_path: Path, distro_id: str, version_id: str, kernel: str, package: str,
        flavour: str, tag: str) -> None:
    write_os_release(tmp_path, distro_id, version_id)
    distro = host.detect_distro(HostRoot(tmp_path))
    family = distros.of(distro)
    assert family.headers_package(kernel) == package
    assert family.kernel_flavour(kernel) == flavour
    assert family.image_tag(distro) == tag
    assert tag in compiler.IMAGE_COMPILERS


def test_amazon_linux_and_oracle_offer_the_dnf_source() -> None:
    """NVIDIA's rhel repos serve Oracle Linux as they serve RHEL; AL2023 has its amzn2023 repo
    (tests/unit/test_dnf_argv_amazon.py)."""
    assert distros.named("amazon").package_sources == ("dnf",)
    assert distros.for_os_release("ol") is distros.named("rhel")
    assert "dnf" in distros.named("rhel").package_sources


@pytest.mark.parametrize(("distro_id", "version_id", "nearest"), [
    ("ubuntu", "18.04", "Ubuntu 20.04"),
    ("ubuntu", "25.10", "Ubuntu 26.04"),
    ("ol", "7.9", "Oracle Linux 8"),
    ("amzn", "2", "Amazon Linux 2023"),
    ("rhel", "7.9", "RHEL 8"),
    ("debian", "10", "Debian 11"),
])
def test_an_unsupported_release_names_the_nearest_supported(
        tmp_path: Path, distro_id: str, version_id: str, nearest: str) -> None:
    write_os_release(tmp_path, distro_id, version_id)
    with pytest.raises(UnsupportedDistro) as info:
        host.detect_distro(HostRoot(tmp_path))
    assert info.value.exit_code == 14
    assert info.value.message.endswith(f"the nearest supported release is {nearest}")


def test_ubuntu_2604_kernels_say_gcc_15_in_proc_version() -> None:
    """Ubuntu names the compiler by its triplet; 26.04's default is gcc-15."""
    line = ("Linux version 7.0.0-15-generic (buildd@lcy02-amd64-012) (x86_64-linux-gnu-gcc-15 "
            "(Ubuntu 15.2.0-4ubuntu4) 15.2.0, GNU ld (GNU Binutils for Ubuntu) 2.45) "
            "#15-Ubuntu SMP PREEMPT_DYNAMIC\n")
    assert compiler.kernel_gcc_major(line) == 15
    assert compiler.tags_with(15) == ["ubuntu26.04"]


@pytest.mark.parametrize(("text", "size"), [
    ("CONFIG_ARM64=y\nCONFIG_ARM64_64K_PAGES=y\nCONFIG_ARM64_PAGE_SHIFT=16\n", 65536),
    ("CONFIG_ARM64_4K_PAGES=y\n", 4096),
    ("CONFIG_ARM64_16K_PAGES=y\n", 16384),
    ("CONFIG_ARM64_PAGE_SHIFT=16\n", 65536),
    ("# CONFIG_ARM64_64K_PAGES is not set\nCONFIG_X86_64=y\n", None),
])
def test_the_page_size_a_config_selects(text: str, size: int | None) -> None:
    assert from_config(text) == size


def test_page_size_from_boot_then_headers_then_the_name(tmp_path: Path) -> None:
    root = make_host(tmp_path / "host", distro="ubuntu-24.04", kernel="6.8.0-1036-nvidia-64k")
    k = "6.8.0-1036-nvidia-64k"
    assert kernel_page_size(root, k, "x86_64").size == 4096
    named = kernel_page_size(root, k, "aarch64")
    assert (named.size, "the kernel's name" in named.source) == (65536, True)
    assert kernel_page_size(root, "6.8.0-87-generic", "aarch64").size is None
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / ".config").write_text("CONFIG_ARM64_4K_PAGES=y\n")
    assert kernel_page_size(root, "6.8.0-87-generic", "aarch64", [tree]).size == 4096
    boot = tmp_path / "host/boot"
    boot.mkdir()
    (boot / f"config-{k}").write_text("CONFIG_ARM64_16K_PAGES=y\n")
    found = kernel_page_size(root, k, "aarch64", [tree])
    assert (found.size, found.source) == (16384, f"the kernel's config (/boot/config-{k})")


def test_the_hosts_machine_is_read_under_its_root(tmp_path: Path) -> None:
    root = make_host(tmp_path, distro="ubuntu-24.04", kernel="6.8.0-1036-nvidia-64k")
    (tmp_path / "proc/sys/kernel/arch").write_text("aarch64\n")
    facts = host.gather(root, free_space_path=tmp_path)
    assert facts.arch == "aarch64"


@pytest.mark.parametrize(("kernel", "packages"), [
    ("5.14.0-503.15.1.el9_5.aarch64+64k", ["kernel-64k-devel-5.14.0-503.15.1.el9_5.aarch64",
                                           "kernel-headers-5.14.0-503.15.1.el9_5.aarch64"]),
    ("6.12.0-105.51.5.el9uek.x86_64", ["kernel-uek-devel-6.12.0-105.51.5.el9uek.x86_64"]),
    ("5.14.0-427.13.1.el9_4.x86_64", ["kernel-devel-5.14.0-427.13.1.el9_4.x86_64",
                                      "kernel-headers-5.14.0-427.13.1.el9_4.x86_64"]),
])
def test_the_dnf_source_installs_the_kernels_own_devel_package(
        kernel: str, packages: list[str]) -> None:
    assert dnf_commands.kernel_packages(kernel) == packages


UEK = "6.12.0-105.51.5.el9uek.x86_64"


def test_oracle_with_nvidias_rhel_repo_gets_the_dnf_source_and_uek_devel(
        tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    plan = plan_for(tmp_path, FakeRunner(), distro="ol-9", kernel=UEK,
                    NVIDIA_DRIVER_VERSION="580", NVIDIA_KERNEL_MODULE_TYPE="open")
    assert decision(plan, "source")[0] == "dnf"
    assert "module streams" in decision(plan, "source")[1]
    assert decision(plan, "kernel-headers")[0] == f"kernel-uek-devel-{UEK}"
    assert decision(plan, "dnf-stream")[0] == "nvidia-driver:580-open"
    assert decision(plan, "image-tag")[0] == "rocky9"


def test_amazon_linux_takes_nvidias_amzn2023_repo_as_the_dnf_source(tmp_path: Path) -> None:
    kernel = "6.1.147-172.266.amzn2023.x86_64"
    bare = plan_for(tmp_path / "bare", FakeRunner(), distro="amzn-2023", kernel=kernel,
                    NVIDIA_DRIVER_VERSION="580.105.08")
    assert decision(bare, "source")[0] == "runfile"
    assert decision(bare, "headers-package")[0] == f"kernel-devel-{kernel}"
    add_repo_file(tmp_path, "cuda-amzn2023.repo")
    plan = plan_for(tmp_path, FakeRunner(), distro="amzn-2023", kernel=kernel,
                    NVIDIA_DRIVER_VERSION="580.105.08")
    assert decision(plan, "source")[0] == "dnf"
    assert "module streams" in decision(plan, "source")[1]
    assert decision(plan, "kernel-headers")[0] == f"kernel-devel-{kernel}"
    assert decision(plan, "dnf-stream")[0] == "nvidia-driver:580-open"  # an H100: open
    forced = plan_for(tmp_path / "forced", FakeRunner(), distro="amzn-2023", kernel=kernel,
                      NVIDIA_DRIVER_SOURCE="dnf", NVIDIA_DRIVER_VERSION="580")
    assert decision(forced, "source")[0] == "dnf"
