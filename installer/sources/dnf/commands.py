"""What the dnf source asks of dnf, rpm and dkms: the stream and packages for a target, and the
argv we run against the host's rpm database (reading what the host has: `host_state.py`; its repo
files: `repos.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer import distros
from installer.distros import Rhel
from installer.distros import dnf as distros_dnf
from installer.host import Distro
from installer.hostroot import HostRoot
from installer.sources.dnf.metadata import version_key
from installer.sources.dnf.repos import REPOS_DIR

MODULE = "nvidia-driver"
PROFILE = "default"
# The profile that adds Fabric Manager (NVIDIA's yum-packaging-fabric-manager: "The NvSwitch
# modularity profile (fm) installs all of the NVIDIA driver packages, as well as Fabric Manager").
FM_PROFILE = "fm"
# NVIDIA's Fabric Manager package: Version is the driver's (no epoch, release 1); named
# nvidia-fabric-manager up to the 575 branch and nvidia-fabricmanager from 580 on.
FM_PACKAGES = ("nvidia-fabric-manager", "nvidia-fabricmanager")
FM_RENAMED_BRANCH = 580
# NVIDIA's NVLink Subnet Manager package (NVLink5 nodes): outside the module streams, its
# Version a date (YYYY.MM.N), apart from the driver's.
NVLSM_PACKAGE = "nvlsm"
KMOD = {"proprietary": "kmod-nvidia-latest-dkms", "open": "kmod-nvidia-open-dkms"}
# The module name each -dkms kmod registers with DKMS (NVIDIA's dkms-nvidia.spec and
# dkms-open-nvidia.spec): /usr/src/<name>-<v>/, `dkms ... -m <name>`, /var/lib/dkms/<name>/.
# The open kmod registered as nvidia-open until 570.148.08 and as nvidia from then on
# (amazon-eks-ami's al2023 install-nvidia-driver.sh renames it back for its archive).
DKMS_NAME = {"proprietary": "nvidia", "open": "nvidia-open"}
OPEN_DKMS_RENAMED = (570, 148, 8)
USERSPACE = ("nvidia-driver", "nvidia-driver-cuda", "nvidia-modprobe")
# Packages whose files may fill versions/<ver>/{bin,lib64} (those not installed are skipped).
USERSPACE_ALL = (
    *USERSPACE,
    "nvidia-driver-libs",
    "nvidia-driver-cuda-libs",
    "nvidia-driver-NVML",
    "nvidia-persistenced",
)
VERSIONLOCK_PLUGIN = "python3-dnf-plugin-versionlock"
VERSIONLOCK_CONF = PurePosixPath("/etc/dnf/plugins/versionlock.conf")
VERSIONLOCK_LIST = PurePosixPath("/etc/dnf/plugins/versionlock.list")
# Module files DKMS and the precompiled kmods put in /lib/modules/<k>/extra.


@dataclass(frozen=True)
class DnfTarget:
    """What the dnf source installs: a module stream (None on EL10, which has no modules),
    the package names, and the exact version when one was pinned (else the stream's newest)."""

    stream: str | None
    flavour: str
    branch: int
    pinned: str | None
    packages: tuple[str, ...]
    # NVIDIA's precompiled stream for the same request (`latest`, `<branch>`); proprietary only.
    precompiled_stream: str | None = None
    # An NVSwitch node: the stream's `fm` profile, Fabric Manager of the driver's version too.
    fabric: bool = False
    # An NVLink5 node: NVLSM's package spec (`nvlsm`, or `nvlsm-<pin>`) in the same transaction.
    nvlsm: str | None = None

    @property
    def profile(self) -> str:
        return FM_PROFILE if self.fabric else PROFILE

    def fabricmanager(self, version: str) -> list[str]:
        """The Fabric Manager package of `version` when the target includes it."""
        return [fabricmanager_package(version)] if self.fabric else []

    @property
    def userspace(self) -> tuple[str, ...]:
        return tuple(n for n in self.packages if n not in KMOD.values())

    @property
    def kmod(self) -> str:
        return KMOD[self.flavour]

    def dkms_name(self, version: str) -> str:
        """The name DKMS files the kmod of `version` under."""
        return dkms_name(self.flavour, version)

    @property
    def other_kmod(self) -> str:
        return KMOD["proprietary" if self.flavour == "open" else "open"]

    def specs(self) -> list[str]:
        """Package specs for dnf: pinned NEVRAs (`name-<version>`), a branch glob on EL10, or
        bare names (the enabled stream decides)."""
        if self.pinned:
            return [f"{name}-{self.pinned}" for name in self.packages]
        if self.stream is None and self.branch:
            return [f"{name}-{self.branch}.*" for name in self.packages]
        return list(self.packages)


def nvlsm_spec(pin: str | None) -> str:
    """`nvlsm-<YYYY.MM.N>` for NVIDIA_NVLSM_VERSION (the rpm's Version is the date version),
    else `nvlsm`: the host's, or the repo's newest when none is installed."""
    return f"{NVLSM_PACKAGE}-{pin}" if pin else NVLSM_PACKAGE


def fabricmanager_package(version: str) -> str:
    branch = int(version.split(".", 1)[0])
    return FM_PACKAGES[1] if branch >= FM_RENAMED_BRANCH else FM_PACKAGES[0]


def dkms_name(flavour: str, version: str) -> str:
    """The DKMS module name of NVIDIA's `flavour` -dkms kmod at `version`."""
    if flavour == "open" and version_key(version) >= OPEN_DKMS_RENAMED:
        return DKMS_NAME["proprietary"]
    return DKMS_NAME[flavour]


def stream_name(request_kind: str, request_value: str, branch: int, flavour: str) -> str:
    """`latest` asks for the newest driver: latest-dkms / open-dkms. A branch, an exact version
    or a GPU-aware alias (auto, lts, production: they chose a branch) use that branch's stream,
    <branch>-dkms / <branch>-open."""
    if request_kind == "alias" and request_value == "latest":
        return "open-dkms" if flavour == "open" else "latest-dkms"
    return f"{branch}-open" if flavour == "open" else f"{branch}-dkms"


def family(distro: Distro) -> Rhel:
    """The RHEL-family class answering for `distro` (the dnf source is offered only there)."""
    found = distros.of(distro)
    assert isinstance(found, Rhel), f"the dnf source is not offered on {distro}"
    return found


def dnf_target(
    distro: Distro, request_kind: str, request_value: str, version: str, branch: int, flavour: str,
    *, fabric: bool = False, nvlsm: str | None = None,
) -> DnfTarget:
    """`fabric`: an NVSwitch node whose Fabric Manager the installer runs (only where NVIDIA's
    repo has module profiles: not EL10); `nvlsm`: on an NVLink5 one, NVLSM's package spec
    beside it."""
    names: tuple[str, ...] = (*USERSPACE, KMOD[flavour])
    if family(distro).module_platform(distro) is None:
        if flavour == "open":
            names = ("nvidia-open", *names)
        latest = request_kind == "alias" and request_value == "latest"
        return DnfTarget(
            None,
            flavour,
            0 if latest else branch,
            version if request_kind == "exact" else None,
            names,
        )
    stream = stream_name(request_kind, request_value, branch, flavour)
    precompiled = None
    if flavour == "proprietary":
        latest = request_kind == "alias" and request_value == "latest"
        precompiled = "latest" if latest else str(branch)
    pinned = version if request_kind == "exact" else None
    return DnfTarget(stream, flavour, branch, pinned, names, precompiled, fabric,
                     nvlsm if fabric else None)


def precompiled_kmod(version: str, kernel: str) -> str:
    """NVIDIA's precompiled kmod for one driver version and one exact kernel:
    kmod-nvidia-<driver>-<kernel version>-<kernel release without dist tag and arch>."""
    kversion, _, rest = kernel.partition("-")
    return f"kmod-nvidia-{version}-{kversion}-{rest.split('.el', 1)[0]}"


@dataclass(frozen=True)
class Choice:
    """The stream and version one transaction installs, and its kmod package."""

    stream: str
    version: str
    kmod: str
    precompiled: bool
    reason: str

    def specs(self, userspace: tuple[str, ...]) -> list[str]:
        return [*(f"{name}-{self.version}" for name in userspace), self.kmod if self.precompiled
                else f"{self.kmod}-{self.version}"]


# --- argv --------------------------------------------------------------------------------


def dnf_base(root: HostRoot, distro: Distro, cache_dir: Path,
             repos_dir: Path | None = None) -> list[str]:
    """dnf acting on the host's rpm database: through --installroot unless the root is `/`.

    dnf takes a cachedir, a reposdir and the key and certificate paths in repo files as paths
    of this process (not under the installroot), so `cache_dir` is the install dir cache as
    reached here and `repos_dir` the host's repo files with those paths re-rooted
    (host_repos_dir; the host's own directory when not given).
    """
    # The `local` plugin (enabled by default where dnf-plugins-core ships it, e.g. Debian's)
    # would copy every package into its own repo and check that repo's GPG signatures.
    common = [
        "--setopt=install_weak_deps=False",
        "--setopt=skip_if_unavailable=False",
        "--disableplugin=local",
        "-y",
    ]
    if root.is_bare:
        return ["dnf", *common]
    rhel = family(distro)
    argv = root.tool_argv(
        "dnf",
        f"--releasever={rhel.dnf_releasever(root, distro)}",
        f"--setopt=reposdir={repos_dir or root.local(REPOS_DIR)}",
        f"--setopt=cachedir={cache_dir}",
    )
    platform = rhel.module_platform(distro)
    if platform is not None:
        argv.append(f"--setopt=module_platform_id={platform}")
    return argv + common


def host_repos_dir(root: HostRoot, cache_dir: Path) -> Path | None:
    """The reposdir for dnf_base: on a host root, copies of the host's repo files under
    `cache_dir` with their gpgkey=/sslcacert= paths re-rooted (the one re-rooting the header
    fetch uses too), rewritten before each use; None on a bare host, where dnf reads the
    host's own. Writes only below `cache_dir`."""
    if root.is_bare:
        return None
    return distros_dnf.write_rerooted_repos(root, cache_dir / "repos.d")


def kernel_packages(kernel: str, distro: Distro | None = None) -> list[str]:
    """What DKMS needs installed for `kernel`, named as `distro`'s family names them (UEK, 64k,
    Amazon's kernel lines); RHEL's names when no distro is given."""
    return (Rhel() if distro is None else family(distro)).host_kernel_packages(kernel)


def kernel_argv(base: list[str], kernel: str, distro: Distro | None = None) -> list[str]:
    return [*base, "install", *kernel_packages(kernel, distro)]


def transaction_argv(
    base: list[str], target: DnfTarget, *, with_versionlock: bool = False
) -> list[str]:
    """One dnf transaction that leaves the host on the target, whatever was there before.

    A stream without a pin: `module switch-to` (enables it, installs the profile and
    distro-syncs the module's packages, also from another stream). A pin: `install` of the
    profile plus the pinned NEVRAs with `module_stream_switch`, so a stream switch and the pin
    (an upgrade or a downgrade) are one transaction. `--allowerasing` lets the other flavour's
    kmod package go. EL10: plain packages.
    """
    if target.stream is None:
        extra = [VERSIONLOCK_PLUGIN] if with_versionlock else []
        return [*base, "install", "--allowerasing", *target.specs(), *extra]
    spec = f"{MODULE}:{target.stream}/{target.profile}"
    if target.pinned is None:
        return [*base, "module", "switch-to", "--allowerasing", spec]
    return [
        *base,
        "install",
        "--allowerasing",
        "--setopt=module_stream_switch=True",
        f"@{spec}",
        *target.specs(),
        *(f"{name}-{target.pinned}" for name in target.fabricmanager(target.pinned)),
    ]


def install_argv(
    base: list[str], target: DnfTarget, choice: Choice, kernel: str, distro: Distro | None = None
) -> list[str]:
    """One transaction: the stream's profile (`fm` on NVSwitch nodes, with Fabric Manager of
    the chosen version pinned too, and NVLSM's package on NVLink5 ones) with the chosen version
    pinned, the kmod, and for DKMS
    kernel-devel/kernel-headers of the target kernel, so either all of it lands or none.
    `module_stream_switch` and `--allowerasing` let it replace another stream's packages."""
    extra = [] if choice.precompiled else kernel_packages(kernel, distro)
    return [
        *base,
        "install",
        "--allowerasing",
        "--setopt=module_stream_switch=True",
        f"@{MODULE}:{choice.stream}/{target.profile}",
        *choice.specs(target.userspace),
        *(f"{name}-{choice.version}" for name in target.fabricmanager(choice.version)),
        *([target.nvlsm] if target.nvlsm else []),
        *extra,
    ]


def makecache_argv(base: list[str]) -> list[str]:
    return [*base, "makecache"]


def module_enable_argv(base: list[str], stream: str) -> list[str]:
    return [*base, "--setopt=module_stream_switch=True", "module", "enable", f"{MODULE}:{stream}"]


def undo_argv(base: list[str], transaction: int) -> list[str]:
    return [*base, "history", "undo", str(transaction)]


def epel_argv(base: list[str]) -> list[str]:
    return [*base, "install", "epel-release"]


def dkms_argv(root: HostRoot, *args: str) -> list[str]:
    """dkms of the host, run in the host root (it builds with the host's compiler and
    kernel-devel, into the host's /var/lib/dkms and /lib/modules)."""
    return root.tool_argv("dkms", *args)


def versionlock_argv(base: list[str], names: tuple[str, ...], version: str) -> list[str]:
    return [*base, "versionlock", "add", *[f"{name}-{version}" for name in names]]


def rpm_base(root: HostRoot) -> list[str]:
    return root.tool_argv("rpm")


def rpm_query_argv(root: HostRoot, names: list[str]) -> list[str]:
    return [*rpm_base(root), "-q", "--qf", "%{NAME} %{VERSION}\\n", *names]


def rpm_files_argv(root: HostRoot, names: list[str]) -> list[str]:
    return [*rpm_base(root), "-ql", *names]
