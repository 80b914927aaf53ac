"""NVLink5 nodes (HGX B200/B300) and IMEX: the InfiniBand modules NVLSM needs, NVLSM itself, and
IMEX of the driver's version."""

from __future__ import annotations

from installer.errors.base import InstallerError


class IbModulesMissing(InstallerError):
    reference = "ib-modules-missing"
    exit_code = 54
    default_hint = (
        "Install the package that holds the running kernel's InfiniBand modules (mlx5_core, "
        "mlx5_ib, ib_umad; `installer plan` names it), then run the installer again."
    )


class IbModuleLoadFailed(InstallerError):
    reference = "ib-module-load-failed"
    exit_code = 55
    default_hint = (
        "modprobe refused an InfiniBand module NVLSM needs: see the kernel log (dmesg) for why "
        "(a module of another kernel, a blacklist in /etc/modprobe.d, Secure Boot), fix it and "
        "run the installer again."
    )


class NvlsmUnavailable(InstallerError):
    reference = "nvlsm-unavailable"
    exit_code = 56
    default_hint = (
        "An NVLink5 node needs NVLSM: set NVIDIA_NVLSM_VERSION (and NVIDIA_NVLSM_SHA256 or a "
        "digests-file entry) to an nvlsm archive under NVIDIA_NVLSM_REDIST, or use a driver "
        "whose redistrib_<version>.json lists nvlsm; NVIDIA_FABRICMANAGER=false leaves NVLSM "
        "and Fabric Manager to the host."
    )


class NvlsmMismatch(InstallerError):
    reference = "nvlsm-mismatch"
    exit_code = 57
    default_hint = (
        "The redist tree serves an NVLSM archive or listing of another layout: fix the mirror's "
        "copy (or NVIDIA_NVLSM_VERSION). No NVLSM file was installed."
    )


class NvlsmMissing(InstallerError):
    reference = "nvlsm-missing"
    exit_code = 58
    default_hint = (
        "The install dir has no NVLSM beside the loaded driver's Fabric Manager, or mlx5_ib "
        "made no IB device for the Limited PF port: let the installer initContainer (`installer "
        "run`) finish on this NVLink5 node first, and keep NVIDIA_FABRICMANAGER=auto on both "
        "containers."
    )



class NvlsmPackageUnavailable(InstallerError):
    reference = "nvlsm-package-unavailable"
    exit_code = 47
    default_hint = (
        "On dnf hosts NVLSM comes from NVIDIA's `nvlsm` package in the host's NVIDIA repo: "
        "check that the repo offers it (`dnf list --showduplicates nvlsm`) and, when "
        "NVIDIA_NVLSM_VERSION pins one, that version; NVIDIA_FABRICMANAGER=false leaves NVLSM "
        "and Fabric Manager to the host."
    )


class NvlsmPackageMismatch(InstallerError):
    reference = "nvlsm-package-mismatch"
    exit_code = 48
    default_hint = (
        "The host's nvlsm package is not the one asked for, or lacks the files NVIDIA's has "
        "(/opt/nvidia/nvlsm/sbin/nvlsm, /usr/share/nvidia/nvlsm/nvlsm.conf): check what the "
        "repo serves (`rpm -qil nvlsm`). No NVLSM file was put into the install dir."
    )

class ImexUnavailable(InstallerError):
    reference = "imex-unavailable"
    exit_code = 59
    default_hint = (
        "IMEX must be exactly the driver's version: check that redistrib_<version>.json at "
        "NVIDIA_FABRICMANAGER_REDIST lists an imex archive for this architecture (or copy both "
        "into your mirror), or set NVIDIA_IMEX=false."
    )


class ImexMismatch(InstallerError):
    reference = "imex-mismatch"
    exit_code = 19
    default_hint = (
        "The redist tree lists or serves an IMEX archive of another version or layout: fix the "
        "mirror's copy of the archive and of redistrib_<version>.json. No IMEX file was "
        "installed."
    )
