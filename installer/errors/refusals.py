"""Refusals before anything on the host changes: settings, versions, the catalog, the
host and its GPUs."""

from __future__ import annotations

from installer.errors.base import InstallerError


class ConfigError(InstallerError):
    reference = "invalid-config"
    exit_code = 10
    default_hint = (
        "Fix the setting named above (flag or environment variable; see docs/settings.md).")


class InvalidVersion(ConfigError):
    reference = "invalid-version"
    exit_code = 11
    default_hint = (
        "Use an exact version (550.54.15), a branch (550 or R550), or an alias "
        "(auto, latest, production, lts); `installer versions` lists the catalog."
    )


class UnknownVersion(InstallerError):
    reference = "unknown-version"
    exit_code = 12
    default_hint = (
        "Pick a version listed by `installer versions`, refresh the catalog with --catalog, "
        "or pin an exact version together with NVIDIA_DRIVER_DOWNLOAD_URL."
    )


class CatalogUnavailable(InstallerError):
    reference = "catalog-unavailable"
    exit_code = 13
    default_hint = (
        "Check the --catalog path or URL, or drop it to use the catalog shipped with the "
        "installer."
    )


class UnsupportedDistro(InstallerError):
    reference = "unsupported-distro"
    exit_code = 14
    default_hint = (
        "Supported: Ubuntu 20.04/22.04/24.04/26.04, Debian 11/12/13, Rocky/RHEL/AlmaLinux/Oracle "
        "Linux 8/9/10, Amazon Linux 2023, SLES 15 SP6, openSUSE Leap 15.6. "
        "Check that ROOT_MOUNT_DIR points at the host's root."
    )


class UnsupportedArch(InstallerError):
    reference = "unsupported-arch"
    exit_code = 15
    default_hint = "Only x86_64 and aarch64 hosts are supported."


class NoNvidiaGpu(InstallerError):
    reference = "no-nvidia-gpu"
    exit_code = 16
    default_hint = (
        "Run on a node with an NVIDIA GPU, or set NVIDIA_INSTALLER_ALLOW_NO_GPU=true "
        "(--allow-no-gpu) to build and install ahead of attaching GPUs."
    )


class IncompatibleGpus(InstallerError):
    reference = "incompatible-gpus"
    exit_code = 17
    default_hint = (
        "One driver cannot serve these GPUs together: split them across nodes or pin a version."
    )


class UnsupportedGpu(InstallerError):
    reference = "unsupported-gpu"
    exit_code = 18
    default_hint = (
        "Pick a version whose branch supports the GPU (see `installer plan`), or use "
        "NVIDIA_DRIVER_VERSION=auto."
    )


class TrustRootInvalid(ConfigError):
    reference = "trust-root-invalid"
    exit_code = 87
    default_hint = (
        "NVIDIA_MODULE_TRUSTED_KEYS must name a readable PEM file of public keys (`cosign "
        "public-key`, `openssl pkey -pubout`) or certificates; NVIDIA_MODULE_PUBLISHER_KEY a "
        "readable, unencrypted PEM private key (ECDSA P-256/P-384, RSA or Ed25519)."
    )


class PageSizeRisk(InstallerError):
    reference = "driver-64k-page-risk"
    exit_code = 78
    default_hint = (
        "Pin a 580 driver (NVIDIA_DRIVER_VERSION=580), whose open modules run on 64k-page "
        "kernels, boot a 4k-page kernel, or set NVIDIA_INSTALLER_ALLOW_64K_PAGE_RISK=true to "
        "install anyway (open-gpu-kernel-modules #1269)."
    )


class DriverBelowFloor(InstallerError):
    reference = "driver-below-floor"
    exit_code = 79
    default_hint = (
        "Ask for a release that meets the floor named above (NVIDIA_DRIVER_VERSION=auto picks "
        "the newest that meets every floor; `installer plan` lists them), or set "
        "NVIDIA_INSTALLER_ALLOW_BELOW_FLOOR=true to try it anyway (docs/supported-hosts.md)."
    )


class NoReleaseMeetsFloors(InstallerError):
    reference = "no-release-meets-floors"
    exit_code = 80
    default_hint = (
        "The catalog lists no release that meets this host's floors: refresh the catalog "
        "(--catalog) or pin a newer exact version with NVIDIA_DRIVER_DOWNLOAD_URL."
    )
