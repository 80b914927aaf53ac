"""Getting files onto the node: downloads, checksums, space, the .run's identity, the
module registry."""

from __future__ import annotations

from installer.errors.base import InstallerError


class DownloadFailed(InstallerError):
    reference = "download-failed"
    exit_code = 20
    default_hint = (
        "Check the node's network or proxy, add a mirror (NVIDIA_DRIVER_MIRRORS), or provide a "
        "file:// URL (NVIDIA_DRIVER_DOWNLOAD_URL) for air-gapped nodes."
    )


class DownloadNotFound(DownloadFailed):
    reference = "download-not-found"
    exit_code = 21
    default_hint = (
        "The server has no such file: check the version, NVIDIA_DRIVER_BRANCH and the URL."
    )


class DownloadForbidden(DownloadFailed):
    reference = "download-forbidden"
    exit_code = 22
    default_hint = (
        "The server refused access (401/403): check credentials, the bucket's policy, or use a "
        "mirror."
    )


class ChecksumMismatch(InstallerError):
    reference = "checksum-mismatch"
    exit_code = 23
    default_hint = (
        "The downloaded file was deleted. Check NVIDIA_DRIVER_SHA256 and the mirror's content; "
        "a proxy may be serving a stale or altered file."
    )


class InsufficientSpace(InstallerError):
    reference = "insufficient-space"
    exit_code = 24
    default_hint = (
        "Free space on the filesystem that holds the install dir, or move "
        "NVIDIA_INSTALL_DIR_HOST."
    )


class RunfileMismatch(InstallerError):
    reference = "runfile-mismatch"
    exit_code = 25
    default_hint = (
        "The download URL or mirror serves another driver than the planned version: point "
        "NVIDIA_DRIVER_DOWNLOAD_URL (or the mirror) at the planned version's .run, or set "
        "NVIDIA_DRIVER_VERSION to the file's version. The file was removed from the cache and "
        "nothing on the host was changed."
    )


class UnverifiedDownload(DownloadFailed):
    reference = "download-unverified"
    exit_code = 26
    default_hint = (
        "A mirror serves bytes only: pin the .run's SHA-256 (NVIDIA_DRIVER_SHA256), list the "
        "file in NVIDIA_DRIVER_DIGESTS_FILE (`installer download --dest DIR` writes DIR/digests "
        "for a mirror: ship it as a ConfigMap), or fetch it over https from an origin in "
        "NVIDIA_DRIVER_TRUSTED_ORIGINS. NVIDIA_DRIVER_ALLOW_UNVERIFIED=true accepts it "
        "unverified, knowingly."
    )


class DownloadTooLarge(DownloadFailed):
    reference = "download-too-large"
    exit_code = 27
    default_hint = (
        "The server sent more bytes than the file may have (its listed size, or the hard cap): "
        "the partial file was removed. Check the mirror, or the size in "
        "NVIDIA_DRIVER_DIGESTS_FILE."
    )


class DigestsFileInvalid(InstallerError):
    reference = "digests-file-invalid"
    exit_code = 28
    default_hint = (
        "NVIDIA_DRIVER_DIGESTS_FILE must be readable and hold lines `<sha256>  <file name>  "
        "[<size>]` (sha256sum's output works; `installer download --dest DIR` writes one)."
    )


class RegistryUnavailable(InstallerError):
    reference = "registry-unavailable"
    exit_code = 75
    default_hint = (
        "Check NVIDIA_MODULE_REGISTRY (host[:port]/repository), that the registry is up and "
        "reachable from the node, and NVIDIA_MODULE_REGISTRY_PLAIN_HTTP for a registry without "
        "TLS. On a node this only costs a compile; `installer prebuild --push` needs it."
    )


class RegistryAuthFailed(RegistryUnavailable):
    reference = "registry-auth-failed"
    exit_code = 76
    default_hint = (
        "The registry refused the credentials (or asked for some): set "
        "NVIDIA_MODULE_REGISTRY_USERNAME and NVIDIA_MODULE_REGISTRY_PASSWORD (from a Secret) "
        "to an account that may pull, and push when NVIDIA_MODULE_REGISTRY_PUSH is on."
    )


class ArtifactInvalid(RegistryUnavailable):
    reference = "artifact-invalid"
    exit_code = 77
    default_hint = (
        "The artifact in the registry does not match what it claims (a digest, its key or the "
        "kernel's vermagic differ): delete its tag and publish it again from a good build."
    )


class ArtifactUntrusted(RegistryUnavailable):
    reference = "artifact-untrusted"
    exit_code = 85
    default_hint = (
        "No signature by a key in NVIDIA_MODULE_TRUSTED_KEYS vouches for the artifact (or its "
        "digest is not in NVIDIA_MODULE_DIGESTS): the node compiles instead. Publish with "
        "`installer prebuild --push` and NVIDIA_MODULE_PUBLISHER_KEY, or sign the artifact "
        "with `cosign sign --key` (docs/deploy.md, \"Prebuilt modules you can trust\")."
    )


class RegistryRealmRefused(RegistryAuthFailed):
    reference = "registry-realm-refused"
    exit_code = 86
    default_hint = (
        "The registry sent the installer to a token service on another host or over plain "
        "HTTP; no credentials were sent there. If that service is the registry's own, list "
        "it in NVIDIA_MODULE_REGISTRY_TOKEN_REALMS (https://host[:port])."
    )


class PrebuiltRequired(InstallerError):
    reference = "prebuilt-modules-required"
    exit_code = 88
    default_hint = (
        "NVIDIA_MODULE_REQUIRE_PREBUILT=true and no verified artifact could be used (the reason "
        "is above): publish one for this key with the builder (`installer prebuild --kernel "
        "<K> --push`), check NVIDIA_MODULE_TRUSTED_KEYS and NVIDIA_MODULE_DIGESTS, or let the "
        "node compile by setting it to false. Nothing on the host was changed."
    )


class ArchiveUnsafe(InstallerError):
    reference = "archive-unsafe"
    exit_code = 62
    default_hint = (
        "The archive holds a member that would land outside its directory (an absolute or `..` "
        "name, a link out of it, a device file): it is not what the publisher ships. Nothing was "
        "unpacked; replace the archive in the mirror or cache with the publisher's own."
    )


class ArchiveTooLarge(InstallerError):
    reference = "archive-too-large"
    exit_code = 124
    default_hint = (
        "The archive unpacks to more than its cap (20 times its own size, at least 16 MiB, a "
        "header block counted for each member): far beyond what a publisher's compressed "
        "archive holds, so it is not the publisher's (a decompression bomb fills the disk). "
        "Nothing was left unpacked; replace the archive in the mirror or cache with the "
        "publisher's own."
    )
