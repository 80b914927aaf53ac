"""The error hierarchy: every known failure has a stable reference, a hint and an exit code.

One module per room of the installer (refusals, delivery, build, host, packages, commands,
cluster); this door exports every class, so callers import from `installer.errors` only. A new
error: its class in the room's module, its name here."""

from __future__ import annotations

from installer.errors.base import InstallerError, all_error_types
from installer.errors.build import (
    CompilerInstallFailed,
    CompilerMissing,
    HeadersFetchFailed,
    KernelHeadersMissing,
    ModuleBuildFailed,
)
from installer.errors.cluster import (
    ClusterApiForbidden,
    ClusterApiUnavailable,
    DriverHoldersTimeout,
    EvictionTimeout,
    NodeNotFound,
    UpgradeAnnotationInvalid,
)
from installer.errors.commands import (
    CommandFailed,
    CommandNotFound,
)
from installer.errors.delivery import (
    ArtifactInvalid,
    ArtifactUntrusted,
    ChecksumMismatch,
    DownloadFailed,
    DownloadForbidden,
    DownloadNotFound,
    InsufficientSpace,
    PrebuiltRequired,
    RegistryAuthFailed,
    RegistryRealmRefused,
    RegistryUnavailable,
    RunfileMismatch,
    UnverifiedDownload,
)
from installer.errors.host import (
    DeviceNodesFailed,
    DriverInUse,
    HostLayoutError,
    InstallFailed,
    LockTimeout,
    ModuleLoadFailed,
    NouveauActive,
    SecureBootKeysMissing,
    VerificationFailed,
)
from installer.errors.packages import (
    DkmsUnavailable,
    ModuleMetadataMissing,
    PackageManagerFailed,
    RepoUnavailable,
)
from installer.errors.refusals import (
    CatalogUnavailable,
    ConfigError,
    IncompatibleGpus,
    InvalidVersion,
    NoNvidiaGpu,
    TrustRootInvalid,
    UnknownVersion,
    UnsupportedArch,
    UnsupportedDistro,
    UnsupportedGpu,
)

__all__ = [
    "ArtifactInvalid",
    "ArtifactUntrusted",
    "CatalogUnavailable",
    "ChecksumMismatch",
    "ClusterApiForbidden",
    "ClusterApiUnavailable",
    "CommandFailed",
    "CommandNotFound",
    "CompilerInstallFailed",
    "CompilerMissing",
    "ConfigError",
    "DeviceNodesFailed",
    "DkmsUnavailable",
    "DownloadFailed",
    "DownloadForbidden",
    "DownloadNotFound",
    "DriverHoldersTimeout",
    "DriverInUse",
    "EvictionTimeout",
    "HeadersFetchFailed",
    "HostLayoutError",
    "IncompatibleGpus",
    "InstallFailed",
    "InstallerError",
    "InsufficientSpace",
    "InvalidVersion",
    "KernelHeadersMissing",
    "LockTimeout",
    "ModuleBuildFailed",
    "ModuleLoadFailed",
    "ModuleMetadataMissing",
    "NoNvidiaGpu",
    "NodeNotFound",
    "NouveauActive",
    "PackageManagerFailed",
    "PrebuiltRequired",
    "RegistryAuthFailed",
    "RegistryRealmRefused",
    "RegistryUnavailable",
    "RepoUnavailable",
    "RunfileMismatch",
    "SecureBootKeysMissing",
    "TrustRootInvalid",
    "UnknownVersion",
    "UnsupportedArch",
    "UnsupportedDistro",
    "UnsupportedGpu",
    "UnverifiedDownload",
    "UpgradeAnnotationInvalid",
    "VerificationFailed",
    "all_error_types",
]
