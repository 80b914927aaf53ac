"""Amazon Linux 2023: the RHEL family's rpm, dnf and header fetch, its own kernel package names
per kernel line, its releasever lock, and NVIDIA's amzn2023 repo as the dnf source."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from installer.distros.rhel import NVIDIA_REPOS, Rhel

if TYPE_CHECKING:
    from installer.distros.family import Release
    from installer.errors import InstallerError
    from installer.hostroot import HostRoot

# The kernel line that ships as plain `kernel` (AL2023's first); every later line is its own
# package, `kernel6.12`, `kernel6.18`, ... with `-devel` beside it.
_FIRST_LINE = "6.1"
# AL2023 writes the release it is locked to (deterministic upgrades) here; without the file dnf
# follows the newest release, which the repos name `latest`.
_RELEASEVER = "/etc/dnf/vars/releasever"


class Amazon(Rhel):
    name = "amazon"
    releases: ClassVar[dict[str, tuple[str, ...]]] = {"amzn": ("2023",)}
    names: ClassVar[dict[str, str]] = {"amzn": "Amazon Linux"}
    # The rocky9 image serves it: the same glibc (2.34) and the gcc 11 its 6.1 kernels are
    # built with; no image of its own.
    image_tags: ClassVar[dict[str, tuple[int, ...]]] = {}

    def kernel_line(self, kernel: str) -> str:
        """The package prefix of `kernel`'s line: `kernel` (6.1) or `kernel6.12`, ..."""
        line = ".".join(kernel.split("-", 1)[0].split(".")[:2])
        return "kernel" if line == _FIRST_LINE else f"kernel{line}"

    def headers_package(self, kernel: str) -> str:
        return f"{self.kernel_line(kernel)}-devel-{kernel}"

    def host_kernel_packages(self, kernel: str) -> list[str]:
        # What NVIDIA's AL2023 instructions and amazon-eks-ami's al2023 driver script install
        # for DKMS: the line's -devel and -headers of exactly the kernel, and -modules-extra
        # (the DRM helpers nvidia-drm links against live there, not in the kernel package).
        line = self.kernel_line(kernel)
        return [f"{line}-devel-{kernel}", f"{line}-headers-{kernel}",
                f"{line}-modules-extra-{kernel}"]

    def image_tag(self, distro: Release) -> str:
        return "rocky9"

    def kernel_flavour(self, kernel: str) -> str:
        return self.kernel_line(kernel)

    # --- the dnf source --------------------------------------------------------------------

    def nvidia_repo_file(self, distro: Release, arch: str) -> str:
        return f"{NVIDIA_REPOS}amzn2023/{arch}/cuda-amzn2023.repo"

    def module_platform(self, distro: Release) -> str | None:
        # AL2023's own repos carry no modules, but NVIDIA's amzn2023 repo has the same
        # nvidia-driver streams as its rhel8/9 ones (amazon-eks-ami resolves
        # nvidia-driver:<branch>-open through `dnf module provides` there); os-release's
        # PLATFORM_ID is platform:al2023.
        return "platform:al2023"

    def dnf_releasever(self, root: HostRoot, distro: Release) -> str:
        # The repos' paths hold the release (2023.9.20251117, or `latest`), never VERSION_ID.
        text = root.read_text(_RELEASEVER)
        return text.strip() if text and text.strip() else "latest"

    def kernel_devel_missing(self, message: str, kernel: str) -> InstallerError:
        from installer.errors import AmazonKernelDevelMissing

        return AmazonKernelDevelMissing(message)

    def dkms_missing(self, message: str) -> InstallerError:
        from installer.errors import AmazonDkmsMissing

        return AmazonDkmsMissing(message)

    def driver_missing(self, message: str) -> InstallerError:
        from installer.errors import AmazonDriverMissing

        return AmazonDriverMissing(message)
