"""Debian and Ubuntu: .deb packages, apt on the host, apt-get in the installer image."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, ClassVar

from installer.distros.family import Family

if TYPE_CHECKING:
    from installer.distros.family import HeaderFetch, Release

_GCC = r"^gcc-\d+$"


class Debian(Family):
    name = "debian"
    # Ubuntu's point releases are separate distros: matched on the full VERSION_ID.
    releases: ClassVar[dict[str, tuple[str, ...]]] = {
        "ubuntu": ("20.04", "22.04", "24.04", "26.04"),
        "debian": ("11", "12", "13"),
    }
    names: ClassVar[dict[str, str]] = {"ubuntu": "Ubuntu", "debian": "Debian"}
    image_tool = "apt-get"
    sources_where = "/etc/apt/sources.list(.d)"
    image_tags: ClassVar[dict[str, tuple[int, ...]]] = {
        "debian12": (12,),
        "debian13": (14,),
        "ubuntu20.04": (9, 10),
        "ubuntu22.04": (11, 12),
        "ubuntu24.04": (12, 13, 14),
        # 26.04's kernels are built with its default gcc-15; gcc-14 for the HWE-style backports.
        "ubuntu26.04": (14, 15),
    }

    def image_tag(self, distro: Release) -> str:
        # Debian's images are named by major release, Ubuntu's by the full VERSION_ID.
        return f"debian{distro.major}" if distro.id == "debian" else super().image_tag(distro)

    def headers_package(self, kernel: str) -> str:
        # The whole release, flavour included: Ubuntu's -nvidia-64k, -generic-64k, -aws,
        # -azure, -gcp and HWE kernels each have their own linux-headers-<release>.
        return f"linux-headers-{kernel}"

    def header_fetch(self) -> HeaderFetch:
        from installer.distros import apt

        return apt

    def ib_modules_package(self, distro: Release, kernel: str) -> str:
        # Ubuntu splits a kernel's modules: mlx5_ib and ib_umad are in linux-modules-extra
        # (cloud images such as EKS's leave it out); Debian's linux-image carries them all.
        if distro.id == "ubuntu":
            return f"linux-modules-extra-{kernel}"
        return f"linux-image-{kernel}"

    def owns_compiler_package(self, package: str) -> bool:
        return re.fullmatch(_GCC, package) is not None

    def compiler_install_argvs(self, package: str) -> list[list[str]]:
        # The image's package lists are removed at build time.
        return [["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]]
