"""The RHEL family (Rocky, RHEL, AlmaLinux): rpm packages, dnf on the host and in the image, and
NVIDIA's dnf packages as a driver source."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, ClassVar

from installer.distros.family import Family

if TYPE_CHECKING:
    from installer.config import Config
    from installer.distros.family import HeaderFetch, Release
    from installer.errors import InstallerError
    from installer.hostroot import HostRoot

# Red Hat's gcc-toolset-N-gcc packages install gcc-N under /opt/rh/gcc-toolset-N/root.
_TOOLSET = r"^gcc-toolset-\d+(-gcc)?$"
_SUFFIX_64K = "+64k"
_UEK = r"\.el\d+uek\."
# NVIDIA's CUDA repos: one folder per distribution release and architecture, each with its .repo.
NVIDIA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos/"


class Rhel(Family):
    name = "rhel"
    releases: ClassVar[dict[str, tuple[str, ...]]] = {
        "rocky": ("8", "9", "10"),
        "rhel": ("8", "9", "10"),
        "almalinux": ("8", "9", "10"),
        "ol": ("8", "9", "10"),
    }
    names: ClassVar[dict[str, str]] = {"rocky": "Rocky Linux", "rhel": "RHEL",
                                       "almalinux": "AlmaLinux", "ol": "Oracle Linux"}
    image_tool = "dnf"
    sources_where = "/etc/yum.repos.d"
    # EL10's kernels are built with its gcc 14.
    image_tags: ClassVar[dict[str, tuple[int, ...]]] = {"rocky8": (8,), "rocky9": (11,),
                                                        "rocky10": (14,)}
    package_sources: ClassVar[tuple[str, ...]] = ("dnf",)

    def headers_package(self, kernel: str) -> str:
        # A 64k-page kernel (`...el9_4.aarch64+64k`) has its own kernel-64k-devel whose version
        # is the 4k kernel's, without the suffix; Oracle's UEK (`...el9uek.x86_64`) has
        # kernel-uek-devel; Red Hat's compatible kernel (RHCK) everywhere has kernel-devel.
        if kernel.endswith(_SUFFIX_64K):
            return f"kernel-64k-devel-{kernel[:-len(_SUFFIX_64K)]}"
        if re.search(_UEK, kernel):
            return f"kernel-uek-devel-{kernel}"
        return f"kernel-devel-{kernel}"

    def host_kernel_packages(self, kernel: str) -> list[str]:
        """What a DKMS build on the host installs for `kernel`: its devel package and, where
        its kernel line ships one, kernel-headers of the same version (UEK ships none)."""
        devel = self.headers_package(kernel)
        if devel.startswith("kernel-uek-"):
            return [devel]
        return [devel, f"kernel-headers-{kernel.removesuffix(_SUFFIX_64K)}"]

    # --- what the dnf source asks of the family ------------------------------------------

    def nvidia_repo_file(self, distro: Release, arch: str) -> str:
        """The URL of NVIDIA's .repo file for this release and architecture."""
        return f"{NVIDIA_REPOS}rhel{distro.major}/{arch}/cuda-rhel{distro.major}.repo"

    def module_platform(self, distro: Release) -> str | None:
        """The module_platform_id dnf resolves NVIDIA's streams against (os-release's
        PLATFORM_ID), or None where NVIDIA's repo has no module streams (EL10: plain packages
        and a version lock)."""
        return f"platform:el{distro.major}" if distro.major < 10 else None

    def dnf_releasever(self, root: HostRoot, distro: Release) -> str:
        """What the dnf source passes as --releasever when it runs dnf on a mounted root."""
        return distro.version_id

    def kernel_devel_missing(self, message: str, kernel: str) -> InstallerError:
        from installer.errors import KernelHeadersMissing

        return KernelHeadersMissing(
            message,
            hint=f"DKMS needs kernel-devel for exactly the kernel {kernel}: enable the repo that "
            "has it (for an older minor release, the vault or the matching --releasever), boot "
            "a kernel whose kernel-devel is available, or use a precompiled stream; the host's "
            "packages were left as they were.")

    def dkms_missing(self, message: str) -> InstallerError:
        from installer.errors import DkmsUnavailable

        return DkmsUnavailable(f"{message}; dkms comes from EPEL")

    def driver_missing(self, message: str) -> InstallerError:
        from installer.errors import ModuleMetadataMissing

        return ModuleMetadataMissing(message)

    def image_tag(self, distro: Release) -> str:
        # One image per EL major serves every rebuild of it (Rocky, RHEL, Alma, Oracle).
        return f"rocky{distro.major}"

    def kernel_flavour(self, kernel: str) -> str:
        if kernel.endswith(_SUFFIX_64K):
            return "64k"
        return "uek" if re.search(_UEK, kernel) else "default"

    def header_fetch(self) -> HeaderFetch:
        from installer.distros import dnf

        return dnf

    def vault(self, config: Config, distro: Release, kernel: str) -> tuple[str, str] | None:
        # Rocky moves the kernels of older minor releases to its vault.
        if distro.id != "rocky" or not config.rocky_vault:
            return None
        from installer.distros import dnf

        return f"Rocky's vault for {dnf.kernel_minor(kernel, distro)}", config.rocky_vault

    def ib_modules_package(self, distro: Release, kernel: str) -> str:
        # kernel-modules-core holds what boots; the InfiniBand drivers are in kernel-modules.
        return f"kernel-modules-{kernel}"

    def owns_compiler_package(self, package: str) -> bool:
        return re.fullmatch(_TOOLSET, package) is not None

    def compiler_install_argvs(self, package: str) -> list[list[str]]:
        return [["dnf", "install", "-y", "--setopt=install_weak_deps=False", "--nodocs", package]]
