"""Amazon Linux 2023: the RHEL family's rpm, dnf and header fetch, its own kernel package names,
and no NVIDIA dnf source (NVIDIA's amzn2023 repo is laid out unlike its rhel ones)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from installer.distros.rhel import Rhel

if TYPE_CHECKING:
    from installer.distros.family import Release

# The kernel line that ships as plain `kernel` (AL2023's first); every later line is its own
# package, `kernel6.12`, `kernel6.18`, ... with `-devel` beside it.
_FIRST_LINE = "6.1"


class Amazon(Rhel):
    name = "amazon"
    releases: ClassVar[dict[str, tuple[str, ...]]] = {"amzn": ("2023",)}
    names: ClassVar[dict[str, str]] = {"amzn": "Amazon Linux"}
    # The rocky9 image serves it: the same glibc (2.34) and the gcc 11 its 6.1 kernels are
    # built with; no image of its own.
    image_tags: ClassVar[dict[str, tuple[int, ...]]] = {}
    package_sources: ClassVar[tuple[str, ...]] = ()

    def headers_package(self, kernel: str) -> str:
        line = ".".join(kernel.split("-", 1)[0].split(".")[:2])
        prefix = "kernel" if line == _FIRST_LINE else f"kernel{line}"
        return f"{prefix}-devel-{kernel}"

    def image_tag(self, distro: Release) -> str:
        return "rocky9"

    def kernel_flavour(self, kernel: str) -> str:
        return self.headers_package(kernel).split("-devel-", 1)[0]
