"""What a failed dnf command means: the repo down, a package or version no repo has, dkms
missing; each as the installer's error with what to do."""

from __future__ import annotations

import re

from installer.errors import (
    CommandFailed,
    InstallerError,
    NvlsmPackageUnavailable,
    PackageManagerFailed,
    RepoUnavailable,
)
from installer.plan import Context
from installer.sources.dnf import commands, repos
from installer.sources.dnf.commands import Choice

REPO_DOWN = (
    "Failed to download metadata for repo",
    "Cannot download repomd.xml",
    "Cannot prepare internal mirrorlist",
    "Curl error",
)
NO_MATCH = "No match for argument"
_NO_DKMS = re.compile(r"nothing provides (?:\S+ )?dkms\b|No match for argument: dkms\b")


def kernel_error(ctx: Context, kernel: str, exc: CommandFailed) -> Exception:
    output = exc.output_tail
    if any(marker in output for marker in REPO_DOWN):
        return repo_down(ctx, output)
    packages = commands.kernel_packages(kernel, ctx.facts.distro)
    if NO_MATCH in output:
        missing = [p for p in packages if p in output] or packages
        return commands.family(ctx.facts.distro).kernel_devel_missing(
            f"{' and '.join(missing)} for kernel {kernel} is in none of the host's repos "
            f"(tried: {repos.repos_tried(ctx.root)})", kernel)
    return transaction_failed(f"installing {', '.join(packages)}", output)


def nvlsm_unavailable(ctx: Context, output: str) -> NvlsmPackageUnavailable:
    line = next((ln for ln in output.splitlines() if f"{NO_MATCH}: {commands.NVLSM_PACKAGE}" in ln),
                commands.NVLSM_PACKAGE)
    return NvlsmPackageUnavailable(
        f"this NVLink5 node needs NVLSM, but dnf found no such package in the host's repos "
        f"({repos.repos_tried(ctx.root)}): {line.strip()}; the host's packages were left as "
        "they were")


def repo_down(ctx: Context, output: str) -> RepoUnavailable:
    line = next((ln for ln in output.splitlines() if any(m in ln for m in REPO_DOWN)), "")
    return RepoUnavailable(
        f"dnf cannot reach a repo: {line.strip() or 'metadata download failed'} "
        f"(repos: {repos.repos_tried(ctx.root)})",
    )


def transaction_failed(what: str, output: str) -> PackageManagerFailed:
    return PackageManagerFailed(f"{what} failed; dnf said:\n{output.strip()}")


def install_error(ctx: Context, choice: Choice, output: str) -> InstallerError:
    if any(marker in output for marker in REPO_DOWN):
        return repo_down(ctx, output)
    rhel = commands.family(ctx.facts.distro)
    if _NO_DKMS.search(output):
        return rhel.dkms_missing(
            f"{choice.kmod} requires dkms, which none of the host's repos provides "
            f"({repos.repos_tried(ctx.root)})"
        )
    if f"{NO_MATCH}: {commands.NVLSM_PACKAGE}" in output:
        return nvlsm_unavailable(ctx, output)
    kernel = ctx.target.kernel
    missing = [p for p in commands.kernel_packages(kernel, ctx.facts.distro)
               if f"{NO_MATCH}: {p}" in output]
    if missing:
        return rhel.kernel_devel_missing(
            f"{' and '.join(missing)} for kernel {kernel} is in none of the host's repos "
            f"(tried: {repos.repos_tried(ctx.root)})", kernel)
    return transaction_failed(
        f"the dnf transaction for {choice.version} of stream "
        f"{commands.MODULE}:{choice.stream}", output
    )
