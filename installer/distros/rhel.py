"""The RHEL family (Rocky, RHEL, AlmaLinux): rpm packages, dnf on the host and in the image, and
NVIDIA's dnf packages as a driver source."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, ClassVar

from installer.distros.family import Family

if TYPE_CHECKING:
    from installer.config import Config
    from installer.distros.family import Facts, Release
    from installer.hostroot import HostRoot
    from installer.runner import Runner

# Red Hat's gcc-toolset-N-gcc packages install gcc-N under /opt/rh/gcc-toolset-N/root.
_TOOLSET = r"^gcc-toolset-\d+(-gcc)?$"


class Rhel(Family):
    name = "rhel"
    releases: ClassVar[dict[str, tuple[str, ...]]] = {
        "rocky": ("8", "9", "10"),
        "rhel": ("8", "9", "10"),
        "almalinux": ("8", "9", "10"),
    }
    image_tool = "dnf"
    sources_where = "/etc/yum.repos.d"
    image_tags: ClassVar[dict[str, tuple[int, ...]]] = {"rocky8": (8,), "rocky9": (11,)}
    package_sources = ("dnf",)

    def headers_package(self, kernel: str) -> str:
        return f"kernel-devel-{kernel}"

    def source_files(self, root: HostRoot) -> list[PurePosixPath]:
        from installer.distros import dnf

        return dnf.repo_files(root)

    def fetch_headers(self, root: HostRoot, config: Config, facts: Facts, work: Path,
                      runner: Runner, package: str, where: str) -> list[str]:
        from installer.distros import dnf

        return dnf.fetch(root, config, facts, work, runner, package, where)

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
