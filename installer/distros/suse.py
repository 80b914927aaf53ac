"""SUSE (SLES and openSUSE Leap): rpm packages, zypper on the host and in the image, a kernel
package per flavour, and SUSE's gccN compiler packages."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, ClassVar

from installer.distros.family import Family

if TYPE_CHECKING:
    from installer.distros.family import HeaderFetch, Release

# SUSE's versioned compilers are packages `gcc7`, `gcc13`, ... each installing /usr/bin/gcc-N
# (the `gcc` package is the release's default, gcc7 on SLE 15).
_GCC = r"^gcc\d+$"


class Suse(Family):
    name = "suse"
    # os-release of SLES 15 SP6: ID="sles", VERSION_ID="15.6"; of Leap 15.6: ID="opensuse-leap",
    # VERSION_ID="15.6" (both ID_LIKE suse). Leap 15.6 boots SLE 15 SP6's own kernel builds
    # (6.4.0-150600.*), so the two share every answer below. Only the service pack the fetch
    # and package names were walked for is accepted; SP7 is a new entry here once walked.
    releases: ClassVar[dict[str, tuple[str, ...]]] = {
        "sles": ("15.6",),
        "opensuse-leap": ("15.6",),
    }
    names: ClassVar[dict[str, str]] = {"sles": "SLES", "opensuse-leap": "openSUSE Leap"}
    image_tool = "zypper"
    sources_where = "/etc/zypp/repos.d"
    # SLE 15's kernels are built with its system gcc 7.5: their /proc/version reads
    # `(gcc (SUSE Linux) 7.5.0, GNU ld (GNU Binutils; SUSE Linux Enterprise 15) ...)` on SP4's
    # 5.14.21-150400 and SP5's 5.14.21-150500 kernels (kernel logs quoted in public bug reports).
    image_tags: ClassVar[dict[str, tuple[int, ...]]] = {"sles15": (7,)}

    def image_tag(self, distro: Release) -> str:
        # One image per SLE major: the BCI base (SLE 15) is Leap 15's userland too.
        return f"sles{distro.major}"

    def kernel_flavour(self, kernel: str) -> str:
        # uname -r is <version>-<release>-<flavour> (6.4.0-150600.23.25-default, -64kb on arm64,
        # -azure, -rt); the flavour itself has no dash, the release may have many dots.
        return kernel.rsplit("-", 1)[1] if kernel.count("-") >= 2 else "default"

    def _version(self, kernel: str) -> str:
        return kernel.rsplit("-", 1)[0] if kernel.count("-") >= 2 else kernel

    def headers_package(self, kernel: str) -> str:
        # kernel-<flavour>-devel holds the flavour's configured tree
        # (/usr/src/linux-<ver>-obj/<arch>/<flavour>) and needs the noarch kernel-devel
        # (/usr/src/linux-<ver>, the sources' headers). Its rpm release carries a rebuild
        # counter uname -r lacks (6.4.0-150600.23.25 is the rpm 6.4.0-150600.23.25.1), but each
        # provides `kernel-<flavour>-devel = <ver>-<release without it>`: what NVIDIA's sle15
        # driver script installs by, and what zypper matches this name against.
        return f"kernel-{self.kernel_flavour(kernel)}-devel-{self._version(kernel)}"

    def header_fetch(self) -> HeaderFetch:
        from installer.distros import zypper

        return zypper

    def ib_modules_package(self, distro: Release, kernel: str) -> str:
        # SUSE ships a flavour's supported modules (mlx5_core, mlx5_ib, ib_umad among them) in
        # kernel-<flavour> itself; kernel-<flavour>-base (minimal images) leaves them out.
        return f"kernel-{self.kernel_flavour(kernel)}-{self._version(kernel)}"

    def owns_compiler_package(self, package: str) -> bool:
        return re.fullmatch(_GCC, package) is not None

    def compiler_install_argvs(self, package: str) -> list[list[str]]:
        return [["zypper", "--non-interactive", "install", "--no-recommends", package]]
