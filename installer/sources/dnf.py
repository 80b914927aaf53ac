"""The RHEL family's packages: NVIDIA's CUDA repo, kernel-devel for the target kernel, the
nvidia-driver module stream (EL8/9) or version-locked packages (EL10), in one dnf transaction
against the host's rpm database, then the install dir filled from the installed packages."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path, PurePosixPath

from installer import modules, versions
from installer.config import Config
from installer.errors import (
    CommandFailed,
    DownloadFailed,
    InstallFailed,
    KernelHeadersMissing,
    PackageManagerFailed,
    RepoUnavailable,
)
from installer.host import Distro
from installer.hostroot import HostRoot
from installer.plan import Context, Step
from installer.sources import dnf_commands as cmd
from installer.sources.dnf_commands import DnfTarget
from installer.steps import COMPLETE_MARKER

log = logging.getLogger(__name__)

REPO_FILE_MAX_BYTES = 256 << 10
_REPO_DOWN = (
    "Failed to download metadata for repo",
    "Cannot download repomd.xml",
    "Cannot prepare internal mirrorlist",
    "Curl error",
)
_NO_MATCH = "No match for argument"


# --- choosing the source (used by the planner) -------------------------------------------


def repo_evidence(root: HostRoot, config: Config) -> str | None:
    """Why the NVIDIA dnf repo counts as configured on this host, or None. Reads files only
    (no network: `plan` and the warm path stay offline)."""
    if config.dnf_repo_url:
        return "NVIDIA_DNF_REPO_URL is set"
    found = cmd.nvidia_repo(root)
    if found is not None:
        return f"{cmd.REPOS_DIR}/{found.file} provides NVIDIA's repo ({found.repo_id})"
    return None


def repo_url(config: Config, distro: Distro, arch: str) -> str:
    return config.dnf_repo_url or cmd.NVIDIA_REPO_URL.format(major=distro.major, arch=arch)


def target_of(ctx: Context) -> DnfTarget:
    request = versions.parse_request(ctx.config.version)
    t = ctx.target
    return cmd.dnf_target(
        ctx.facts.distro, request.kind, request.value, t.version, t.branch, t.flavour
    )


# --- steps -------------------------------------------------------------------------------


def dnf_steps(ctx: Context) -> list[Step]:
    """add-dnf-repo, install-kernel-devel, install-driver-packages, [lock-driver-version],
    populate-install-dir."""
    dt = target_of(ctx)
    plan = [repo_step(ctx), kernel_devel_step(ctx), transaction_step(ctx, dt)]
    if dt.stream is None:
        plan.append(versionlock_step(ctx, dt))
    plan.append(populate_step(ctx, dt))
    return plan


def _base(ctx: Context) -> list[str]:
    return cmd.dnf_base(ctx.root, ctx.facts.distro, ctx.layout.cache_local / "dnf")


def repo_step(ctx: Context) -> Step:
    distro = ctx.facts.distro
    url = repo_url(ctx.config, distro, ctx.facts.arch)
    dest = cmd.REPOS_DIR / cmd.repo_file_name(url, distro.major)

    def satisfied() -> bool:
        if ctx.root.local(dest).is_file():
            return True
        return not ctx.config.dnf_repo_url and cmd.nvidia_repo(ctx.root) is not None

    def apply() -> None:
        from installer import delivery

        settings = delivery.DownloadSettings(
            retries=ctx.config.retries,
            connect_timeout=ctx.config.connect_timeout,
            read_timeout=ctx.config.read_timeout,
            progress="none",
        )
        shown = delivery.redact_url(url)
        try:
            data = delivery.fetch_bytes(url, settings, max_bytes=REPO_FILE_MAX_BYTES)
        except DownloadFailed as exc:
            raise RepoUnavailable(f"cannot fetch the dnf repo file {shown}: {exc.message}") from exc
        text = data.decode("utf-8", errors="replace")
        try:
            ids = cmd.check_repo_file(text)
        except ValueError as exc:
            raise RepoUnavailable(f"{shown} is not a usable dnf repo file: {exc}") from exc
        ctx.root.local(cmd.REPOS_DIR).mkdir(parents=True, exist_ok=True)
        ctx.root.write_atomic(dest, text)
        log.info("added %s (%s) from %s", dest, ", ".join(ids), shown)

    return Step(
        "add-dnf-repo", f"NVIDIA's repo file as {dest} unless one is there", satisfied, apply
    )


def kernel_devel_step(ctx: Context) -> Step:
    kernel = ctx.target.kernel
    packages = cmd.kernel_packages(kernel)

    def satisfied() -> bool:
        return cmd.all_installed(ctx.root, ctx.runner, packages)

    def apply() -> None:
        try:
            ctx.runner.run(cmd.kernel_argv(_base(ctx), kernel), stream=True, timeout=1800)
        except CommandFailed as exc:
            raise _kernel_error(ctx, kernel, exc) from exc

    return Step(
        "install-kernel-devel",
        f"{' and '.join(packages)} (DKMS builds against them)",
        satisfied,
        apply,
    )


def _kernel_error(ctx: Context, kernel: str, exc: CommandFailed) -> Exception:
    output = exc.output_tail
    if any(marker in output for marker in _REPO_DOWN):
        return _repo_down(ctx, output)
    if _NO_MATCH in output:
        missing = [p for p in cmd.kernel_packages(kernel) if p in output] or cmd.kernel_packages(
            kernel
        )
        return KernelHeadersMissing(
            f"{' and '.join(missing)} for kernel {kernel} is in none of the host's repos "
            f"(tried: {cmd.repos_tried(ctx.root)})",
            hint=f"DKMS needs kernel-devel for exactly the running kernel {kernel}: enable the "
            "repo that has it (for an older minor release, the vault or the matching "
            "--releasever), or boot a kernel whose kernel-devel is available.",
        )
    return _transaction_failed(f"installing {', '.join(cmd.kernel_packages(kernel))}", output)


def _repo_down(ctx: Context, output: str) -> RepoUnavailable:
    line = next((ln for ln in output.splitlines() if any(m in ln for m in _REPO_DOWN)), "")
    return RepoUnavailable(
        f"dnf cannot reach a repo: {line.strip() or 'metadata download failed'} "
        f"(repos: {cmd.repos_tried(ctx.root)})",
    )


def _transaction_failed(what: str, output: str) -> PackageManagerFailed:
    return PackageManagerFailed(f"{what} failed; dnf said:\n{output.strip()}")


def transaction_step(ctx: Context, dt: DnfTarget) -> Step:
    names = list(dt.packages)
    where = f"stream {cmd.MODULE}:{dt.stream}" if dt.stream else "packages (EL10: no streams)"
    what = f"version {dt.pinned}" if dt.pinned else "the newest version"

    def installed_version() -> str | None:
        """The one version of every wanted package when the host is on the target, else
        None. Adopts it as the target version when the stream decides."""
        if dt.stream is not None:
            state = cmd.module_state(ctx.root)
            if state.stream != dt.stream or state.state != "enabled":
                return None
        found = cmd.installed_versions(ctx.root, ctx.runner, [*names, dt.other_kmod])
        if dt.other_kmod in found or set(found) != set(names):
            return None
        versions_found = set(found.values())
        if len(versions_found) != 1:
            return None
        version = versions_found.pop()
        if dt.pinned and version != dt.pinned:
            return None
        return version

    def satisfied() -> bool:
        version = installed_version()
        if version is None:
            return False
        ctx.target.version = version
        return True

    def apply() -> None:
        lock = dt.stream is None and not ctx.root.local(cmd.VERSIONLOCK_CONF).is_file()
        argv = cmd.transaction_argv(_base(ctx), dt, with_versionlock=lock)
        log.info("dnf: %s of %s", what, where)
        try:
            ctx.runner.run(argv, stream=True, timeout=3600)
        except CommandFailed as exc:
            output = exc.output_tail
            if any(marker in output for marker in _REPO_DOWN):
                raise _repo_down(ctx, output) from exc
            if _NO_MATCH in output and dt.pinned:
                raise PackageManagerFailed(
                    f"version {dt.pinned} is not in {where} of the host's repos "
                    f"({cmd.repos_tried(ctx.root)}); dnf said:\n{output.strip()}",
                    hint="Pick a version the repo has (`dnf module info nvidia-driver:"
                    f"{dt.stream}`), or a branch; the host's packages were left as they were.",
                ) from exc
            raise _transaction_failed(f"the dnf transaction for {what} of {where}", output) from exc
        version = installed_version()
        if version is None:
            raise InstallFailed(
                f"dnf finished but the host is not on {what} of {where} ({', '.join(names)})"
            )
        ctx.target.version = version
        log.info("dnf: the host has %s %s", ", ".join(names), version)

    return Step(
        "install-driver-packages", f"one dnf transaction: {what} of {where}", satisfied, apply
    )


def versionlock_step(ctx: Context, dt: DnfTarget) -> Step:
    """EL10 has no streams: keep `dnf update` from moving the driver with a version lock."""

    def wanted() -> list[str]:
        return [f"{name}-{ctx.target.version}" for name in dt.packages]

    def satisfied() -> bool:
        text = ctx.root.read_text(cmd.VERSIONLOCK_LIST) or ""
        return all(_locked(text, name, ctx.target.version) for name in dt.packages)

    def apply() -> None:
        base = _base(ctx)
        ctx.runner.run([*base, "versionlock", "delete", *dt.packages], check=False, timeout=300)
        try:
            ctx.runner.run(
                cmd.versionlock_argv(base, dt.packages, ctx.target.version),
                stream=True,
                timeout=300,
            )
        except CommandFailed as exc:
            raise _transaction_failed("dnf versionlock add", exc.output_tail) from exc
        log.info("locked %s", ", ".join(wanted()))

    return Step("lock-driver-version", "dnf versionlock on the driver packages", satisfied, apply)


def _locked(versionlock_list: str, name: str, version: str) -> bool:
    """The plugin writes `name-[epoch:]version-release.*` lines."""
    for line in versionlock_list.splitlines():
        rest = line.strip().removeprefix(f"{name}-")
        if rest == line.strip():
            continue
        if rest.split(":", 1)[-1].startswith(f"{version}-"):
            return True
    return False


# --- the install dir from the packages ---------------------------------------------------


def populate_step(ctx: Context, dt: DnfTarget) -> Step:
    """versions/<ver>/{bin,lib64} from the packages' files (GKE's layout that consumers mount),
    and the kmod's modules in the module cache (the `drivers` link, the insmod fallback).
    The modules stay where the kmod package put them; depmod makes modprobe find them."""
    layout, t = ctx.layout, ctx.target

    def satisfied() -> bool:
        return (layout.version_dir(t.version) / COMPLETE_MARKER).is_file() and (
            layout.module_build(t.version, t.kernel, t.flavour) / COMPLETE_MARKER
        ).is_file()

    def apply() -> None:
        version = t.version
        present = cmd.installed_versions(ctx.root, ctx.runner, list(cmd.USERSPACE_ALL))
        userspace = sorted(n for n, v in present.items() if v == version)
        files = _package_files(ctx, [*userspace, dt.kmod])
        final = layout.version_dir(version)
        if not (final / COMPLETE_MARKER).is_file():
            _fill_version_dir(ctx, files, final, version)
        build = layout.module_build(version, t.kernel, t.flavour)
        if not (build / COMPLETE_MARKER).is_file():
            _fill_module_dir(ctx, files, build)
        _retire_runfile_modules(ctx)
        if _writable(ctx.root.local(f"/lib/modules/{t.kernel}")):
            ctx.runner.run(modules.depmod_argv(ctx.root, t.kernel), timeout=300)

    return Step(
        "populate-install-dir",
        "versions/<ver>/{bin,lib64} and the module cache from the installed packages' files",
        satisfied,
        apply,
    )


def _package_files(ctx: Context, names: list[str]) -> list[PurePosixPath]:
    result = ctx.runner.run(cmd.rpm_files_argv(ctx.root, names), timeout=120)
    return [
        PurePosixPath(line.strip()) for line in result.output.splitlines() if line.startswith("/")
    ]


def _fill_version_dir(ctx: Context, files: list[PurePosixPath], final: Path, version: str) -> None:
    staging = final.with_name(f".{final.name}.tmp")
    _remove(staging)
    (staging / "bin").mkdir(parents=True)
    (staging / "lib64").mkdir()
    count = 0
    for path in files:
        local = ctx.root.local(path)
        if local.is_symlink() or not local.is_file():
            continue
        if path.parent.name == "bin" and path.name.startswith("nvidia-"):
            _link_or_copy(local, staging / "bin" / path.name)
        elif path.parent.name in ("lib64", "lib") and ".so." in path.name:
            _link_or_copy(local, staging / "lib64" / path.name)
        else:
            continue
        count += 1
    if not (staging / "bin" / "nvidia-smi").is_file():
        _remove(staging)
        raise InstallFailed(
            f"the installed packages of {version} have no nvidia-smi (rpm -ql listed none)"
        )
    ctx.runner.run(["ldconfig", "-n", str(staging / "lib64")], timeout=120)
    (staging / COMPLETE_MARKER).write_text(version + "\n")
    _remove(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, final)
    log.info("filled %s with %d files from the packages", final, count)


def _fill_module_dir(ctx: Context, files: list[PurePosixPath], build: Path) -> None:
    t = ctx.target
    prefix = f"/lib/modules/{t.kernel}/"
    kos = [p for p in files if str(p).startswith(prefix) and p.name.endswith(".ko")]
    if not any(p.name == "nvidia.ko" for p in kos):
        raise InstallFailed(
            f"the kmod package left no nvidia.ko for kernel {t.kernel} under {prefix}",
            hint="DKMS builds for the kernel that runs; check `dkms status` on the node and "
            "that kernel-devel matches it.",
        )
    staging = build.with_name(f".{build.name}.tmp")
    _remove(staging)
    staging.mkdir(parents=True)
    for path in kos:
        _link_or_copy(ctx.root.local(path), staging / path.name)
    (staging / COMPLETE_MARKER).write_text(f"{t.version} {t.kernel} {t.flavour}\n")
    _remove(build)
    os.replace(staging, build)


def _retire_runfile_modules(ctx: Context) -> None:
    """A runfile install's modules sit in updates/, which modprobe prefers over extra/."""
    ours = ctx.root.local(ctx.layout.host_modules_dir(ctx.target.kernel))
    if ours.exists():
        _remove(ours)
        log.info("removed the runfile install's modules in %s", ours)


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
