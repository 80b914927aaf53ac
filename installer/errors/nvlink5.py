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
