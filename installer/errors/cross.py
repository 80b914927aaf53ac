"""Cross-building modules on a builder of another architecture: toolchain, headers, kbuild."""

from __future__ import annotations

from installer.errors.base import InstallerError


class CrossCompilerMissing(InstallerError):
    reference = "cross-compiler-missing"
    exit_code = 66
    default_hint = (
        "Install the cross compiler named above on the builder (Debian, Ubuntu: "
        "gcc-<major>-aarch64-linux-gnu or gcc-aarch64-linux-gnu), or build on a node of the "
        "target architecture."
    )


class HeadersWrongArch(InstallerError):
    reference = "headers-wrong-arch"
    exit_code = 67
    default_hint = (
        "Install the headers of the target architecture's kernel on the builder (Debian: "
        "dpkg --add-architecture arm64; apt-get install linux-headers-<release>:arm64), or give "
        "--arch the architecture the headers are for."
    )


class KbuildToolsWrongArch(InstallerError):
    reference = "kbuild-tools-wrong-arch"
    exit_code = 68
    default_hint = (
        "The headers' scripts/ must be the builder's own programs: install the builder "
        "architecture's kbuild package (Debian: linux-kbuild-<version> for amd64, which the "
        "arm64 headers package accepts), not the target's."
    )


class CrossBuildUnsupported(InstallerError):
    reference = "cross-build-unsupported"
    exit_code = 69
    default_hint = (
        "Build on a node of the target architecture for this, or leave the option named above "
        "out of the cross build."
    )
