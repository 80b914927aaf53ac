"""The dnf source's decisions and the exact argv it builds (no process runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lib import hostreleases
from lib.hosttrees import make_host

from installer import distros, errors
from installer.config import from_env
from installer.errors import RepoFileRefused
from installer.host import Distro
from installer.hostroot import HostRoot
from installer.sources.dnf import commands as dnf_commands
from installer.sources.dnf import host_state
from installer.sources.dnf import repos as dnf_repos
from installer.sources.dnf.plan import repo_url

EL9 = Distro("rocky", "9.4", 9, "rhel", "Rocky Linux 9.4 (Blue Onyx)")
EL8 = Distro("rocky", "8.9", 8, "rhel", "Rocky Linux 8.9 (Green Obsidian)")
EL10 = Distro("rocky", "10.0", 10, "rhel", "Rocky Linux 10.0 (Red Quartz)")
CACHE = Path("/root/home/kubernetes/bin/nvidia/cache/dnf")


@pytest.mark.parametrize(
    ("kind", "value", "branch", "flavour", "stream"),
    [
        ("branch", "580", 580, "proprietary", "580-dkms"),
        ("branch", "580", 580, "open", "580-open"),
        ("exact", "580.105.08", 580, "proprietary", "580-dkms"),
        ("exact", "570.172.08", 570, "open", "570-open"),
        ("alias", "latest", 610, "proprietary", "latest-dkms"),
        ("alias", "latest", 610, "open", "open-dkms"),
        # GPU-aware aliases chose a branch (e.g. 470 for a K80): its stream, not latest-dkms.
        ("alias", "auto", 470, "proprietary", "470-dkms"),
        ("alias", "lts", 580, "open", "580-open"),
    ],
)
def test_stream_from_the_request(
    kind: str, value: str, branch: int, flavour: str, stream: str
) -> None:
    assert dnf_commands.stream_name(kind, value, branch, flavour) == stream


def test_pinned_target_pins_every_package() -> None:
    target = dnf_commands.dnf_target(EL9, "exact", "580.105.08", "580.105.08", 580, "proprietary")
    assert target.stream == "580-dkms"
    assert target.specs() == [
        "nvidia-driver-580.105.08", "nvidia-driver-cuda-580.105.08", "nvidia-modprobe-580.105.08",
        "kmod-nvidia-latest-dkms-580.105.08",
    ]
    assert target.other_kmod == "kmod-nvidia-open-dkms"


def test_branch_target_leaves_the_version_to_the_stream() -> None:
    target = dnf_commands.dnf_target(EL9, "branch", "580", "580.126.20", 580, "open")
    assert (target.stream, target.pinned) == ("580-open", None)
    assert target.specs() == [
        "nvidia-driver", "nvidia-driver-cuda", "nvidia-modprobe", "kmod-nvidia-open-dkms",
    ]


def test_el10_has_no_stream_and_globs_the_branch() -> None:
    target = dnf_commands.dnf_target(EL10, "branch", "580", "580.126.20", 580, "open")
    assert target.stream is None
    assert target.specs() == [
        "nvidia-open-580.*", "nvidia-driver-580.*", "nvidia-driver-cuda-580.*",
        "nvidia-modprobe-580.*", "kmod-nvidia-open-dkms-580.*",
    ]
    latest = dnf_commands.dnf_target(EL10, "alias", "latest", "610.43.02", 610, "proprietary")
    assert latest.specs() == [
        "nvidia-driver", "nvidia-driver-cuda", "nvidia-modprobe", "kmod-nvidia-latest-dkms",
    ]


def test_dnf_base_acts_on_the_host_root(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    assert dnf_commands.dnf_base(root, EL9, CACHE) == [
        "dnf", f"--installroot={tmp_path}", "--releasever=9.4",
        f"--setopt=reposdir={tmp_path}/etc/yum.repos.d", f"--setopt=cachedir={CACHE}",
        "--setopt=module_platform_id=platform:el9", "--setopt=install_weak_deps=False",
        "--setopt=skip_if_unavailable=False", "--disableplugin=local", "-y",
    ]
    base = dnf_commands.dnf_base(root, EL10, CACHE)
    assert "--setopt=module_platform_id=platform:el10" not in base


def test_the_transaction_reads_the_hosts_repo_files_with_their_paths_rerooted(
        tmp_path: Path) -> None:
    """dnf --installroot reads gpgkey=file:// and sslcacert= from this process's filesystem:
    the transaction's reposdir holds the host's files with those paths inside the host root
    (the same re-rooting as the header fetch), and the host's own files stay as they are."""
    host = tmp_path / "host"
    repos = host / "etc/yum.repos.d"
    repos.mkdir(parents=True)
    own = ("[cuda-rhel9-x86_64]\nname=cuda\nbaseurl=https://mirror.example/cuda/\n"
           "enabled=1\ngpgcheck=1\ngpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-cuda\n"
           "sslcacert=/etc/pki/tls/certs/mirror-ca.pem\n")
    (repos / "cuda-rhel9.repo").write_text(own)
    (repos / "broken.repo").write_text("not an ini file\n")
    (repos / "notes.txt").write_text("not a repo\n")
    cache = tmp_path / "cache/dnf"
    (cache / "repos.d").mkdir(parents=True)
    (cache / "repos.d/stale.repo").write_text("[gone]\n")
    root = HostRoot(host)

    made = dnf_commands.host_repos_dir(root, cache)

    assert made == cache / "repos.d"
    assert sorted(p.name for p in made.iterdir()) == ["broken.repo", "cuda-rhel9.repo"]
    text = (made / "cuda-rhel9.repo").read_text()
    assert f"gpgkey = file://{host}/etc/pki/rpm-gpg/RPM-GPG-KEY-cuda" in text
    assert f"sslcacert = {host}/etc/pki/tls/certs/mirror-ca.pem" in text
    assert "baseurl = https://mirror.example/cuda/" in text
    assert "skip_if_unavailable" not in text  # the transaction keeps a dead repo fatal
    assert (made / "broken.repo").read_text() == "not an ini file\n"
    assert (repos / "cuda-rhel9.repo").read_text() == own
    assert f"--setopt=reposdir={made}" in dnf_commands.dnf_base(root, EL9, cache, made)
    assert dnf_commands.host_repos_dir(HostRoot(Path("/")), cache) is None


def test_dnf_base_is_plain_dnf_on_a_bare_host() -> None:
    assert dnf_commands.dnf_base(HostRoot(Path("/")), EL8, CACHE) == [
        "dnf", "--setopt=install_weak_deps=False", "--setopt=skip_if_unavailable=False",
        "--disableplugin=local", "-y",
    ]


BASE = ["dnf", "-y"]
# An install of the driver's module stream, which may switch the stream a host was on.
STREAM_INSTALL = [*BASE, "install", "--allowerasing", "--setopt=module_stream_switch=True"]
EL9_KERNEL = "5.14.0-427.el9.x86_64"


def test_unpinned_stream_is_one_switch_to() -> None:
    target = dnf_commands.dnf_target(EL9, "branch", "580", "580.126.20", 580, "proprietary")
    assert dnf_commands.transaction_argv(BASE, target) == [
        "dnf", "-y", "module", "switch-to", "--allowerasing", "nvidia-driver:580-dkms/default",
    ]


def test_pinned_stream_is_one_install_that_may_switch_streams() -> None:
    target = dnf_commands.dnf_target(EL9, "exact", "580.105.08", "580.105.08", 580, "open")
    assert dnf_commands.transaction_argv(BASE, target) == [
        *STREAM_INSTALL,
        "@nvidia-driver:580-open/default", "nvidia-driver-580.105.08",
        "nvidia-driver-cuda-580.105.08", "nvidia-modprobe-580.105.08",
        "kmod-nvidia-open-dkms-580.105.08",
    ]


def test_el10_installs_packages_and_the_versionlock_plugin_when_missing() -> None:
    target = dnf_commands.dnf_target(EL10, "exact", "580.105.08", "580.105.08", 580, "proprietary")
    assert dnf_commands.transaction_argv(BASE, target, with_versionlock=True) == [
        "dnf", "-y", "install", "--allowerasing", "nvidia-driver-580.105.08",
        "nvidia-driver-cuda-580.105.08", "nvidia-modprobe-580.105.08",
        "kmod-nvidia-latest-dkms-580.105.08", "python3-dnf-plugin-versionlock",
    ]
    assert dnf_commands.versionlock_argv(BASE, target.packages, "580.105.08") == [
        "dnf", "-y", "versionlock", "add",
        *target.specs(),
    ]


def test_kernel_and_rpm_argv(tmp_path: Path) -> None:
    assert dnf_commands.kernel_argv(BASE, "5.14.0-427.13.1.el9_4.x86_64") == [
        "dnf", "-y", "install", "kernel-devel-5.14.0-427.13.1.el9_4.x86_64",
        "kernel-headers-5.14.0-427.13.1.el9_4.x86_64",
    ]
    root = HostRoot(tmp_path)
    assert dnf_commands.rpm_query_argv(root, ["nvidia-driver"]) == [
        "rpm",
        "--root",
        str(tmp_path),
        "-q",
        "--qf",
        "%{NAME} %{VERSION}\\n",
        "nvidia-driver",
    ]
    assert dnf_commands.rpm_files_argv(HostRoot(Path("/")), ["a", "b"]) == ["rpm", "-ql", "a", "b"]


def test_module_state_is_read_from_modules_d(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    assert host_state.module_state(root) == host_state.ModuleState(None, None)
    state = tmp_path / "etc/dnf/modules.d/nvidia-driver.module"
    state.parent.mkdir(parents=True)
    state.write_text(
        "[nvidia-driver]\nname=nvidia-driver\nstream=580-open\nprofiles=default\nstate=enabled\n"
    )
    assert host_state.module_state(root) == host_state.ModuleState("580-open", "enabled")
    state.write_text("garbage")
    assert host_state.module_state(root) == host_state.ModuleState(None, None)


def test_nvidia_repo_is_recognised_by_file_or_url(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    repos = tmp_path / "etc/yum.repos.d"
    repos.mkdir(parents=True)
    (repos / "rocky.repo").write_text("[baseos]\nmirrorlist=https://mirrors.rockylinux.org/x\n")
    assert dnf_repos.nvidia_repo(root) is None
    (repos / "mirror.repo").write_text(
        "[cuda]\nbaseurl=https://mirror.example/compute/cuda/repos/rhel9/x86_64\nenabled=0\n"
    )
    assert dnf_repos.nvidia_repo(root) is None  # disabled
    (repos / "mirror.repo").write_text(
        "[cuda]\nbaseurl=https://user:pw@mirror.example/compute/cuda/repos/rhel9/x86_64\n"
    )
    found = dnf_repos.nvidia_repo(root)
    assert found is not None and found.repo_id == "cuda"
    assert "pw" not in dnf_repos.repos_tried(root)
    assert "cuda (https://***@mirror.example" in dnf_repos.repos_tried(root)


def test_repo_file_name_and_check() -> None:
    url = "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/cuda-rhel9.repo"
    assert dnf_repos.repo_file_name(url, "cuda-rhel8.repo") == "cuda-rhel9.repo"
    assert dnf_repos.repo_file_name("http://127.0.0.1:8080/get?repo=x", "cuda-rhel8.repo") == (
        "cuda-rhel8.repo")
    signed = "[a]\nbaseurl=file:///r\ngpgcheck=1\ngpgkey=file:///r/k.pub\n"
    assert dnf_repos.check_repo_file(signed, url, local=True) == "a"
    with pytest.raises(RepoFileRefused, match="defines 2 repos"):  # test_dnf_repos.py
        dnf_repos.check_repo_file(signed + "[b]\nname=b\n", url, local=True)
    with pytest.raises(RepoFileRefused):
        dnf_repos.check_repo_file("<html>404</html>", url, local=False)
    with pytest.raises(RepoFileRefused):
        dnf_repos.check_repo_file("[a]\nname=no url\ngpgcheck=1\ngpgkey=file:///k\n", url,
                                  local=False)


def test_nvidia_repo_url_is_per_major() -> None:
    assert dnf_commands.family(EL8).nvidia_repo_file(EL8, "x86_64") == (
        "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo"
    )


def test_installed_versions_parses_rpm_and_skips_missing(tmp_path: Path) -> None:
    from lib.fakes import FakeRunner

    runner = FakeRunner().on(
        "rpm",
        output="nvidia-driver 580.105.08\npackage kmod-nvidia-open-dkms is not installed\n",
        returncode=1,
    )
    root = make_host(tmp_path, distro="rocky-9")
    wanted = ["nvidia-driver", "kmod-nvidia-open-dkms"]
    assert host_state.installed_versions(root, runner, wanted) == {"nvidia-driver": "580.105.08"}


def test_an_nvswitch_node_installs_the_streams_fm_profile_with_fabric_manager_pinned() -> None:
    """NVIDIA's Fabric Manager package: nvidia-fabric-manager up to 575, nvidia-fabricmanager
    from 580 on; pinned to the driver's version beside the fm profile."""
    assert dnf_commands.fabricmanager_package("575.57.08") == "nvidia-fabric-manager"
    assert dnf_commands.fabricmanager_package("580.105.08") == "nvidia-fabricmanager"
    target = dnf_commands.dnf_target(EL9, "branch", "570", "570.172.08", 570, "proprietary",
                                     fabric=True)
    assert (target.profile, target.fabricmanager("570.172.08")) == (
        "fm", ["nvidia-fabric-manager"])
    choice = dnf_commands.Choice("570-dkms", "570.172.08", "kmod-nvidia-latest-dkms", False, "")
    assert dnf_commands.install_argv(BASE, target, choice, EL9_KERNEL) == [
        *STREAM_INSTALL,
        "@nvidia-driver:570-dkms/fm",
        "nvidia-driver-570.172.08", "nvidia-driver-cuda-570.172.08",
        "nvidia-modprobe-570.172.08", "kmod-nvidia-latest-dkms-570.172.08",
        "nvidia-fabric-manager-570.172.08",
        f"kernel-devel-{EL9_KERNEL}", f"kernel-headers-{EL9_KERNEL}",
    ]
    pinned = dnf_commands.dnf_target(EL9, "exact", "580.105.08", "580.105.08", 580, "open",
                                     fabric=True)
    assert dnf_commands.transaction_argv(BASE, pinned)[5:] == [
        "@nvidia-driver:580-open/fm", "nvidia-driver-580.105.08",
        "nvidia-driver-cuda-580.105.08", "nvidia-modprobe-580.105.08",
        "kmod-nvidia-open-dkms-580.105.08", "nvidia-fabricmanager-580.105.08"]
    assert dnf_commands.transaction_argv(BASE, dnf_commands.dnf_target(
        EL9, "branch", "580", "580.126.20", 580, "proprietary", fabric=True))[-1] == (
        "nvidia-driver:580-dkms/fm")
    # EL10 has no module profiles: the dnf source leaves Fabric Manager to the host there.
    el10 = dnf_commands.dnf_target(EL10, "branch", "580", "580.126.20", 580, "open", fabric=True)
    assert (el10.fabric, el10.fabricmanager("580.126.20")) == (False, [])
    # Elsewhere, the default profile as before.
    plain = dnf_commands.dnf_target(EL9, "branch", "580", "580.126.20", 580, "open")
    assert (plain.profile, plain.fabricmanager("580.126.20")) == ("default", [])


def test_an_nvlink5_node_installs_nvlsm_in_the_drivers_transaction() -> None:
    """NVIDIA's nvlsm package (its Version a date) joins the fm profile's transaction: unpinned
    the host's or the repo's newest, else the pin; never without Fabric Manager."""
    assert (dnf_commands.nvlsm_spec(None), dnf_commands.nvlsm_spec("2025.06.6")) == (
        "nvlsm", "nvlsm-2025.06.6")
    target = dnf_commands.dnf_target(EL9, "branch", "580", "580.105.08", 580, "open", fabric=True,
                            nvlsm="nvlsm-2025.06.6")
    choice = dnf_commands.Choice("580-open", "580.105.08", "kmod-nvidia-open-dkms", False, "")
    assert dnf_commands.install_argv(BASE, target, choice, EL9_KERNEL) == [
        *STREAM_INSTALL,
        "@nvidia-driver:580-open/fm",
        "nvidia-driver-580.105.08", "nvidia-driver-cuda-580.105.08",
        "nvidia-modprobe-580.105.08", "kmod-nvidia-open-dkms-580.105.08",
        "nvidia-fabricmanager-580.105.08", "nvlsm-2025.06.6",
        f"kernel-devel-{EL9_KERNEL}", f"kernel-headers-{EL9_KERNEL}",
    ]
    # No Fabric Manager of ours (EL10, no profiles): no NVLSM either.
    el10 = dnf_commands.dnf_target(EL10, "branch", "580", "580.126.20", 580, "open", fabric=True,
                          nvlsm="nvlsm")
    assert el10.nvlsm is None
    assert dnf_commands.dnf_target(EL9, "branch", "580", "580.126.20", 580, "open",
                          nvlsm="nvlsm").nvlsm is None


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


# --- Amazon Linux 2023: NVIDIA's amzn2023 repo, its module streams resolved against
# platform:al2023, the host's releasever lock, each kernel line's packages, its own errors.

_AMAZON = hostreleases.release("amzn-2023")
AL2023 = Distro(_AMAZON.id, _AMAZON.version_id, int(_AMAZON.version_id), "amazon",
                _AMAZON.pretty_name)
K61 = _AMAZON.dnf_kernels[0][0]
AMAZON_CACHE = Path("/cache/dnf")


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
    argv = dnf_commands.dnf_base(root, AL2023, AMAZON_CACHE)
    assert "--releasever=latest" in argv  # no lock file: the newest release
    assert "--setopt=module_platform_id=platform:al2023" in argv
    assert "--releasever=2023" not in argv
    (tmp_path / "etc/dnf/vars").mkdir(parents=True)
    (tmp_path / "etc/dnf/vars/releasever").write_text("2023.9.20251117\n")
    assert "--releasever=2023.9.20251117" in dnf_commands.dnf_base(root, AL2023, AMAZON_CACHE)


@pytest.mark.parametrize(("kernel", "line"), [
    pytest.param(kernel, line, id=kernel) for kernel, line in _AMAZON.dnf_kernels])
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
