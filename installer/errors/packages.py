"""The distro's packages (the dnf source): transactions, repos, DKMS, module metadata."""

from __future__ import annotations

from installer.errors.base import InstallerError


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


class RepoFileRefused(InstallerError):
    reference = "repo-file-refused"
    exit_code = 63
    default_hint = (
        "Serve NVIDIA's own .repo file (or a copy of it) at NVIDIA_DNF_REPO_URL: exactly one "
        "enabled repo section with gpgcheck=1, its signing key(s) named by gpgkey= (https:// or "
        "file://), and a baseurl, metalink or mirrorlist over https:// (file:// only in a .repo "
        "given as a file:// URL). Nothing was written to the host's /etc/yum.repos.d."
    )


class HostRepoInsecure(InstallerError):
    reference = "host-repo-insecure"
    exit_code = 64
    default_hint = (
        "The host's own NVIDIA repo file lets dnf install unsigned packages: set gpgcheck=1 in "
        "it (and import or name NVIDIA's key with gpgkey=), or remove it so the installer adds "
        "NVIDIA's. The installer does not edit the host's repo files and left it as it was."
    )


class RepoUrlInsecure(InstallerError):
    reference = "repo-url-insecure"
    exit_code = 65
    default_hint = (
        "A .repo file fetched over plain http:// could name any signing key: serve it over "
        "https:// (set REQUESTS_CA_BUNDLE for a private CA) or copy it onto the node and give "
        "a file:// URL in NVIDIA_DNF_REPO_URL."
    )


class AmazonKernelDevelMissing(InstallerError):
    reference = "amazon-kernel-devel-missing"
    exit_code = 90
    default_hint = (
        "DKMS needs the kernel line's -devel, -headers and -modules-extra of exactly the running "
        "kernel. Amazon Linux 2023 locks dnf to one release (/etc/dnf/vars/releasever): a kernel "
        "from another release has no -devel in the locked one. Boot the kernel the locked "
        "release carries (`dnf update kernel*` and reboot), or lock the host to the release "
        "the running kernel came from; the host's packages were left as they were."
    )


class AmazonDkmsMissing(InstallerError):
    reference = "amazon-dkms-missing"
    exit_code = 91
    default_hint = (
        "Amazon Linux 2023 has no EPEL: dkms comes from NVIDIA's amzn2023 repo, whose x86_64 "
        "folder carries it (noarch) and whose aarch64 folder does not. Install dkms on the host "
        "first (on arm64 from the x86_64 folder of NVIDIA's repo, as amazon-eks-ami does); the "
        "host's packages were left as they were."
    )


class AmazonDriverMissing(InstallerError):
    reference = "amazon-driver-missing"
    exit_code = 92
    default_hint = (
        "NVIDIA's amzn2023 repo does not offer that driver: list what it has with `dnf module "
        "list nvidia-driver` on the host, and set NVIDIA_DRIVER_VERSION to one of its versions "
        "or branches (or use NVIDIA_DRIVER_SOURCE=runfile)."
    )
