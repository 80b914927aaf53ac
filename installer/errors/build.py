"""Building the kernel modules: headers, the compiler, the build itself."""

from __future__ import annotations

from installer.errors.base import InstallerError


class KernelHeadersMissing(InstallerError):
    reference = "kernel-headers-missing"
    exit_code = 30
    default_hint = (
        "Install the headers package named above on the host, or configure a source that has it."
    )


class ModuleBuildFailed(InstallerError):
    reference = "module-build-failed"
    exit_code = 31
    default_hint = "See the compiler output above and the nvidia-installer log in the install dir."


class CompilerMissing(InstallerError):
    reference = "compiler-missing"
    exit_code = 43
    default_hint = "Use the installer image tag named above, which carries that compiler."


class HeadersFetchFailed(InstallerError):
    reference = "headers-fetch-failed"
    exit_code = 44
    default_hint = (
        "Check the host's package sources and keys (or NVIDIA_INSTALLER_HEADERS_MIRROR); nothing "
        "was changed on the host."
    )


class CompilerInstallFailed(InstallerError):
    reference = "compiler-install-failed"
    exit_code = 45
    default_hint = (
        "The image's package sources did not deliver the compiler: check the node's route to "
        "them (or a proxy), or use the installer image tag named above, which carries it."
    )
