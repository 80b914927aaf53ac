"""The dnf source on Amazon Linux 2023: NVIDIA's amzn2023 repo, its module streams resolved
against platform:al2023, the host's releasever lock, each kernel line's packages, and the
AL2023 errors (no process runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer import distros, errors
from installer.config import from_env
from installer.host import Distro
from installer.hostroot import HostRoot
from installer.sources.dnf import commands as dnf_commands
from installer.sources.dnf.plan import repo_url

AL2023 = Distro("amzn", "2023", 2023, "amazon", "Amazon Linux 2023.9.20251117")
CACHE = Path("/cache/dnf")
K61 = "6.1.147-172.266.amzn2023.x86_64"
K612 = "6.12.40-63.114.amzn2023.aarch64"


def test_the_dnf_source_is_offered_with_nvidias_amzn2023_repo() -> None:
    assert "dnf" in distros.of(AL2023).package_sources
    config = from_env({})
    assert repo_url(config, AL2023, "aarch64") == (
        "https://developer.download.nvidia.com/compute/cuda/repos/amzn2023/aarch64/"
        "cuda-amzn2023.repo")


def test_streams_like_el9_not_plain_packages_like_el10() -> None:
    target = dnf_commands.dnf_target(AL2023, "branch", "580", "580.126.20", 580, "open")
    assert (target.stream, target.pinned) == ("580-open", None)
    assert target.packages == ("nvidia-driver", "nvidia-driver-cuda", "nvidia-modprobe",
                               "kmod-nvidia-open-dkms")
    pinned = dnf_commands.dnf_target(AL2023, "exact", "580.105.08", "580.105.08", 580,
                                     "proprietary")
    assert (pinned.stream, pinned.pinned) == ("580-dkms", "580.105.08")


def test_dnf_runs_against_the_hosts_releasever_lock_and_al2023_platform(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    argv = dnf_commands.dnf_base(root, AL2023, CACHE)
    assert "--releasever=latest" in argv  # no lock file: the newest release
    assert "--setopt=module_platform_id=platform:al2023" in argv
    assert "--releasever=2023" not in argv
    (tmp_path / "etc/dnf/vars").mkdir(parents=True)
    (tmp_path / "etc/dnf/vars/releasever").write_text("2023.9.20251117\n")
    assert "--releasever=2023.9.20251117" in dnf_commands.dnf_base(root, AL2023, CACHE)


@pytest.mark.parametrize(("kernel", "line"), [(K61, "kernel"), (K612, "kernel6.12")])
def test_dkms_gets_the_kernel_lines_devel_headers_and_modules_extra(kernel: str,
                                                                    line: str) -> None:
    assert dnf_commands.kernel_packages(kernel, AL2023) == [
        f"{line}-devel-{kernel}", f"{line}-headers-{kernel}", f"{line}-modules-extra-{kernel}"]
    target = dnf_commands.dnf_target(AL2023, "branch", "580", "580.126.20", 580, "proprietary")
    choice = dnf_commands.Choice("580-dkms", "580.126.20", "kmod-nvidia-latest-dkms", False, "")
    assert dnf_commands.install_argv(["dnf"], target, choice, kernel, AL2023)[-3:] == (
        dnf_commands.kernel_packages(kernel, AL2023))


def test_al2023_failures_have_their_own_references_and_codes() -> None:
    family = dnf_commands.family(AL2023)
    found = [family.kernel_devel_missing("m", K61), family.dkms_missing("m"),
             family.driver_missing("m")]
    assert [(type(e), e.reference, e.exit_code) for e in found] == [
        (errors.AmazonKernelDevelMissing, "amazon-kernel-devel-missing", 90),
        (errors.AmazonDkmsMissing, "amazon-dkms-missing", 91),
        (errors.AmazonDriverMissing, "amazon-driver-missing", 92)]
    assert "/etc/dnf/vars/releasever" in found[0].hint
    assert "aarch64" in found[1].hint
    # RHEL's stay as they were.
    rhel = dnf_commands.family(Distro("rocky", "9.4", 9, "rhel", "Rocky Linux 9.4"))
    assert rhel.dkms_missing("m").reference == "dkms-unavailable"
    assert rhel.kernel_devel_missing("m", "k").reference == "kernel-headers-missing"
