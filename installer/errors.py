"""The error hierarchy: every known failure has a stable reference, a hint and an exit code."""

from __future__ import annotations


class InstallerError(Exception):
    """A failure the operator can act on.

    `reference` is a stable kebab-case name (logs, termination message, README);
    `exit_code` is distinct per reference; `hint` says what to do about it.
    """

    reference = "installer-error"
    exit_code = 1
    default_hint = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint


class ConfigError(InstallerError):
    reference = "invalid-config"
    exit_code = 10
    default_hint = "Fix the setting named above (flag or environment variable; see the README)."


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
        "Supported: Ubuntu 20.04/22.04/24.04, Debian 11/12, Rocky/RHEL/AlmaLinux 8/9/10. "
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


class SecureBootKeysMissing(InstallerError):
    reference = "secure-boot-unsigned"
    exit_code = 32
    default_hint = (
        "Secure Boot rejects unsigned modules: set NVIDIA_MODULE_SIGNING_KEY and "
        "NVIDIA_MODULE_SIGNING_CERT to a key enrolled in the node's MOK list, "
        "or disable Secure Boot."
    )


class NouveauActive(InstallerError):
    reference = "nouveau-active"
    exit_code = 33
    default_hint = (
        "nouveau is blacklisted on the host now; reboot the node and the installer will finish."
    )


class DriverInUse(InstallerError):
    reference = "driver-in-use"
    exit_code = 34
    default_hint = (
        "Stop the processes listed above (or drain the node), then restart the installer pod."
    )


class ModuleLoadFailed(InstallerError):
    reference = "module-load-failed"
    exit_code = 35
    default_hint = "See the kernel log (dmesg) on the node for the reason the module was rejected."


class InstallFailed(InstallerError):
    reference = "install-failed"
    exit_code = 36
    default_hint = "See the nvidia-installer log in the install dir."


class DeviceNodesFailed(InstallerError):
    reference = "device-nodes-failed"
    exit_code = 37
    default_hint = (
        "Check that /dev is the host's /dev (a hostPath volume) and the container is privileged."
    )


class VerificationFailed(InstallerError):
    reference = "verification-failed"
    exit_code = 40
    default_hint = (
        "The driver did not answer as planned; see the report above and dmesg on the node."
    )


class LockTimeout(InstallerError):
    reference = "lock-timeout"
    exit_code = 41
    default_hint = (
        "Another installer holds the host lock; wait for it or raise "
        "NVIDIA_INSTALLER_LOCK_TIMEOUT."
    )


class HostLayoutError(InstallerError):
    reference = "host-layout"
    exit_code = 42
    default_hint = (
        "Check the mounts: ROOT_MOUNT_DIR must hold the host's root and the install dir must be "
        "writable."
    )


class PackageManagerFailed(InstallerError):
    reference = "package-transaction-failed"
    exit_code = 50
    default_hint = (
        "See the package manager output above; the host's packages were left as they were."
    )


class RepoUnavailable(InstallerError):
    reference = "repo-unavailable"
    exit_code = 51
    default_hint = "Check NVIDIA_DNF_REPO_URL, the node's network, or use the runfile source."


class CommandFailed(InstallerError):
    reference = "command-failed"
    exit_code = 60
    default_hint = "See the command output above."

    def __init__(
        self,
        argv: list[str],
        returncode: int,
        output_tail: str,
        *,
        message: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.output_tail = output_tail
        text = message or f"`{' '.join(argv)}` exited with status {returncode}"
        if output_tail:
            text += "\n" + output_tail
        super().__init__(text, hint=hint)


class CommandNotFound(InstallerError):
    reference = "command-not-found"
    exit_code = 61
    default_hint = (
        "The image lacks a tool the installer needs; use the published image or install it."
    )



# issue 12
class CompilerMissing(InstallerError):
    reference = "compiler-missing"
    exit_code = 43
    default_hint = "Use the installer image tag named above, which carries that compiler."


class CompilerInstallFailed(InstallerError):
    reference = "compiler-install-failed"
    exit_code = 45
    default_hint = (
        "The image's package sources did not deliver the compiler: check the node's route to "
        "them (or a proxy), or use the installer image tag named above, which carries it."
    )


class HeadersFetchFailed(InstallerError):
    reference = "headers-fetch-failed"
    exit_code = 44
    default_hint = (
        "Check the host's package sources and keys (or NVIDIA_INSTALLER_HEADERS_MIRROR); nothing "
        "was changed on the host."
    )

def all_error_types() -> list[type[InstallerError]]:
    """Every error class, for the README table and the uniqueness test."""
    found: list[type[InstallerError]] = []
    pending: list[type[InstallerError]] = [InstallerError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.exit_code)


# issue 14
class UnverifiedDownload(DownloadFailed):
    reference = "download-unverified"
    exit_code = 26
    default_hint = (
        "Pin the file's SHA-256 (NVIDIA_DRIVER_SHA256), publish <file>.sha256sum beside it, or "
        "accept unverified files knowingly with NVIDIA_DRIVER_ALLOW_UNVERIFIED=true."
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


# issue 9
class RunfileMismatch(InstallerError):
    reference = "runfile-mismatch"
    exit_code = 25
    default_hint = (
        "The download URL or mirror serves another driver than the planned version: point "
        "NVIDIA_DRIVER_DOWNLOAD_URL (or the mirror) at the planned version's .run, or set "
        "NVIDIA_DRIVER_VERSION to the file's version. The file was removed from the cache and "
        "nothing on the host was changed."
    )


# issue 10
class DkmsUnavailable(InstallerError):
    reference = "dkms-unavailable"
    exit_code = 52
    default_hint = (
        "NVIDIA's -dkms kmod packages require `dkms`, which comes from EPEL: enable EPEL on the "
        "host (Rocky: `dnf install epel-release`; RHEL: the EPEL release RPM) or set "
        "NVIDIA_DNF_ENABLE_EPEL=true, or use a precompiled stream (NVIDIA_DRIVER_VERSION=<branch> "
        "on a kernel NVIDIA ships a kmod for). The host's packages were left as they were."
    )


class ModuleMetadataMissing(InstallerError):
    reference = "module-metadata-missing"
    exit_code = 53
    default_hint = (
        "The configured repo has no nvidia-driver module metadata (modules.yaml) or not the "
        "stream asked for: check NVIDIA_DNF_REPO_URL / the .repo file points at NVIDIA's CUDA "
        "repo for this EL release, and that the version or branch exists there "
        "(`dnf module list nvidia-driver`)."
    )


# issue 13: the upgrade protocol's talk with the API server (installer/cluster)
class ClusterApiUnavailable(InstallerError):
    reference = "cluster-api-unavailable"
    exit_code = 70
    default_hint = (
        "The installer could not talk to the Kubernetes API server; check the node's network "
        "and NVIDIA_INSTALLER_KUBECONFIG (or the pod's service account). Nothing on the node "
        "was changed by this attempt; the pod retries."
    )


class ClusterApiForbidden(InstallerError):
    reference = "cluster-api-forbidden"
    exit_code = 71
    default_hint = (
        "The API server refused the request: apply the upgrade protocol's Component "
        "(daemonset/components/upgrade-protocol: ServiceAccount, RBAC, admission policy), and "
        "check that the installer writes only to its own node (the message names the policy)."
    )


class NodeNotFound(InstallerError):
    reference = "node-not-found"
    exit_code = 72
    default_hint = (
        "NODE_NAME must be this node's name: set it from the downward API (fieldRef "
        "spec.nodeName)."
    )


class EvictionTimeout(InstallerError):
    reference = "eviction-timeout"
    exit_code = 73
    default_hint = (
        "GPU pods named above did not leave in time (a PodDisruptionBudget or a pod that does "
        "not terminate). The node was uncordoned and its labels restored if the installer had "
        "changed them; the old driver keeps working. Move the pods or relax the budget, raise "
        "NVIDIA_INSTALLER_EVICTION_TIMEOUT, or set NVIDIA_INSTALLER_FORCE_EVICTION=true."
    )


class DriverHoldersTimeout(InstallerError):
    reference = "driver-holders-timeout"
    exit_code = 74
    default_hint = (
        "Processes named above kept /dev/nvidia* open after the GPU pods left (a DaemonSet pod "
        "that does not follow nvidia.com/gpu.deploy.<component> labels, or a host process). "
        "The node was restored; stop them, add their component to "
        "NVIDIA_INSTALLER_PAUSE_COMPONENTS, or raise NVIDIA_INSTALLER_HOLDERS_TIMEOUT."
    )


# issue 20: fleet trust (publisher identity of module artifacts, the upgrade protocol's state)
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


class TrustRootInvalid(ConfigError):
    reference = "trust-root-invalid"
    exit_code = 87
    default_hint = (
        "NVIDIA_MODULE_TRUSTED_KEYS must name a readable PEM file of public keys (`cosign "
        "public-key`, `openssl pkey -pubout`) or certificates; NVIDIA_MODULE_PUBLISHER_KEY a "
        "readable, unencrypted PEM private key (ECDSA P-256/P-384, RSA or Ed25519)."
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


class UpgradeAnnotationInvalid(InstallerError):
    reference = "upgrade-annotation-invalid"
    exit_code = 89
    default_hint = (
        "The node's nvidia-driver-installer/upgrade annotation is not what the installer "
        "writes. Look at it (`kubectl get node <node> -o yaml`), restore the node by hand "
        "(uncordon, the nvidia.com/gpu.deploy.* labels) and remove the annotation "
        "(`kubectl annotate node <node> nvidia-driver-installer/upgrade-`)."
    )
