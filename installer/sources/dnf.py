"""The RHEL family's packages: NVIDIA's CUDA repo, then one dnf transaction against the host's
rpm database: the nvidia-driver module stream (EL8/9; precompiled when NVIDIA ships a kmod for the
exact kernel, else DKMS with kernel-devel) or version-locked packages (EL10); DKMS made to build
for the target kernel; the install dir filled from the packages' and DKMS's files."""

from __future__ import annotations

import logging
import lzma
import os
import re
import shutil
from pathlib import Path, PurePosixPath

from installer import modules, versions
from installer.config import Config
from installer.dirs import is_complete, mark_complete, remove_tree, staged_dir
from installer.errors import (
    CommandFailed,
    DkmsUnavailable,
    DownloadFailed,
    InstallerError,
    InstallFailed,
    KernelHeadersMissing,
    ModuleBuildFailed,
    ModuleMetadataMissing,
    PackageManagerFailed,
    RepoUnavailable,
)
from installer.host import Distro
from installer.hostroot import HostRoot
from installer.plan import Context, Decision, Step
from installer.sources import dnf_commands as cmd
from installer.sources import dnf_metadata
from installer.sources.dnf_commands import Choice, DnfTarget
from installer.steps import driver_free_before_packages_step

log = logging.getLogger(__name__)

REPO_FILE_MAX_BYTES = 256 << 10
_REPO_DOWN = (
    "Failed to download metadata for repo",
    "Cannot download repomd.xml",
    "Cannot prepare internal mirrorlist",
    "Curl error",
)
_NO_MATCH = "No match for argument"
_NO_DKMS = re.compile(r"nothing provides (?:\S+ )?dkms\b|No match for argument: dkms\b")


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
    from installer.components import fabricmanager  # issue 21: NVSwitch nodes

    request = versions.parse_request(ctx.config.version)
    t = ctx.target
    return cmd.dnf_target(
        ctx.facts.distro, request.kind, request.value, t.version, t.branch, t.flavour,
        fabric=fabricmanager.applies(ctx),
    )


# --- steps -------------------------------------------------------------------------------


def dnf_steps(ctx: Context) -> list[Step]:
    """add-dnf-repo, [enable-epel], install-driver-packages (EL8/9: one transaction with
    kernel-devel, then DKMS for the target kernel), or on EL10 install-kernel-devel,
    install-driver-packages, lock-driver-version; then populate-install-dir (and on NVSwitch
    nodes install-fabricmanager from the fm profile's package). When the driver
    is to be loaded, check-driver-free comes right before the packages change."""
    dt = target_of(ctx)
    plan = [repo_step(ctx)]
    if ctx.config.dnf_enable_epel:
        plan.append(epel_step(ctx))
    packages = stream_transaction_step(ctx, dt) if dt.stream else transaction_step(ctx, dt)
    if dt.stream is None:
        plan.append(kernel_devel_step(ctx))
    if ctx.target.load:
        plan.append(driver_free_before_packages_step(ctx, packages))
    plan.append(packages)
    if dt.stream is None:
        plan.append(versionlock_step(ctx, dt))
    plan.append(populate_step(ctx, dt))
    if dt.fabric:  # issue 21: Fabric Manager came with the fm profile
        from installer.sources import dnf_fabricmanager

        plan.append(dnf_fabricmanager.install_step(ctx))
    return plan


def _cache_dir(ctx: Context) -> Path:
    if ctx.root.is_bare:
        return ctx.root.local("/var/cache/dnf")
    return ctx.layout.cache_local / "dnf"


def plan_decisions(ctx: Context) -> list[Decision]:
    """What `plan` can say offline about the stream and version dnf will install: from the
    module metadata dnf cached on an earlier run, else how it will be chosen."""
    dt = target_of(ctx)
    if dt.stream is None:
        packages = f"{dt.branch}.* packages" if dt.branch else "packages"
        return _pending_version(ctx, dt, f"NVIDIA's repo ({packages}; EL10 has no streams)")
    streams = dnf_metadata.read_cached(_cache_dir(ctx))
    kernel = ctx.target.kernel
    if streams is None:
        options = " or ".join(s for s in (dt.precompiled_stream, dt.stream) if s)
        return [
            Decision(
                "dnf-stream",
                f"{cmd.MODULE}:{options}",
                "chosen when run, from the repo's module metadata (not cached here yet): the "
                f"precompiled stream when NVIDIA ships a kmod for kernel {kernel}, else DKMS; "
                "the version is the stream's newest unless pinned",
            ),
            *_pending_version(ctx, dt, f"stream {cmd.MODULE}:{options}"),
        ]
    try:
        choice = choose(dt, kernel, streams)
    except ModuleMetadataMissing as exc:
        ctx.target.version_pending = True
        return [Decision("dnf-stream", "unavailable", exc.message),
                Decision("version", "none", f"`run` fails: {exc.message}")]
    ctx.target.version = choice.version
    return [
        Decision("dnf-stream", f"{cmd.MODULE}:{choice.stream}", choice.reason),
        Decision(
            "version",
            choice.version,
            f"what dnf installs from stream {choice.stream} (the repo's cached module metadata)",
        ),
    ]


def _pending_version(ctx: Context, dt: DnfTarget, where: str) -> list[Decision]:
    """Unpinned, dnf installs the newest the repo offers, which is known only when run: the
    catalog's version (what the runfile source would install) is not named (issue 19)."""
    if dt.pinned:
        return []
    ctx.target.version_pending = True
    return [Decision("version", f"the newest in {where}, chosen when run",
                     "dnf installs what the repo offers; its module metadata is not cached here "
                     "yet (the first run caches it, then plan names the version)")]


def choose(dt: DnfTarget, kernel: str, streams: dnf_metadata.Streams) -> Choice:
    """The stream and version for a request: the pin, else the newest the DKMS stream (or the
    precompiled one) offers; precompiled when NVIDIA ships that version's kmod for `kernel`.
    Raises ModuleMetadataMissing when the repo offers neither."""
    assert dt.stream is not None
    dkms_versions = streams.versions(dt.stream)
    pre = dt.precompiled_stream
    pre_versions = streams.versions(pre) if pre else []
    if dt.pinned:
        version = dt.pinned
    elif dkms_versions or pre_versions:
        version = (dkms_versions or pre_versions)[-1]
    else:
        raise ModuleMetadataMissing(
            f"the repo's module metadata has no stream {cmd.MODULE}:{dt.stream}"
            + (f" or {pre}" if pre else "")
            + f" (streams there: {', '.join(sorted(streams.packages)) or 'none'})"
        )
    if pre and version in pre_versions:
        kmod = cmd.precompiled_kmod(version, kernel)
        if streams.has(pre, version, kmod):
            return Choice(
                pre,
                version,
                kmod,
                True,
                f"precompiled stream {pre}: NVIDIA ships {kmod} for kernel {kernel} (no "
                "compiler, kernel-devel or EPEL; NVIDIA-signed)",
            )
        why = f"NVIDIA ships no precompiled kmod of {version} for kernel {kernel} ({kmod})"
    elif pre:
        why = f"precompiled stream {pre} has no {version}"
    else:
        why = "the open flavour comes from DKMS streams only"
    if version not in dkms_versions:
        offered = ", ".join(dkms_versions) or "nothing"
        raise ModuleMetadataMissing(
            f"version {version} is not in stream {cmd.MODULE}:{dt.stream} ({offered}) and {why}"
        )
    return Choice(dt.stream, version, dt.kmod, False, f"DKMS stream {dt.stream}: {why}")


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
        _ensure_dkms(ctx, dt.dkms_name, version)
        log.info("dnf: the host has %s %s", ", ".join(names), version)

    return Step(
        "install-driver-packages", f"one dnf transaction: {what} of {where}", satisfied, apply
    )


def epel_step(ctx: Context) -> Step:
    """NVIDIA_DNF_ENABLE_EPEL: epel-release from the host's repos (Rocky: extras), for dkms."""

    def satisfied() -> bool:
        entries = cmd.repo_entries(ctx.root)
        enabled = any(e.enabled and e.repo_id.startswith("epel") for e in entries)
        return enabled or cmd.all_installed(ctx.root, ctx.runner, ["dkms"])

    def apply() -> None:
        try:
            ctx.runner.run(cmd.epel_argv(_base(ctx)), stream=True, timeout=1800)
        except CommandFailed as exc:
            raise RepoUnavailable(
                "NVIDIA_DNF_ENABLE_EPEL is set but epel-release could not be installed from the "
                f"host's repos ({cmd.repos_tried(ctx.root)}); dnf said:\n{exc.output_tail.strip()}",
                hint="Enable the repo that has epel-release (Rocky: extras) or add EPEL yourself.",
            ) from exc

    return Step("enable-epel", "epel-release unless an EPEL repo is enabled (for dkms)",
                satisfied, apply)


def stream_transaction_step(ctx: Context, dt: DnfTarget) -> Step:
    """EL8/9: one transaction to the chosen stream and version (with kernel-devel for DKMS),
    then DKMS made to install for the target kernel; a DKMS failure undoes the transaction."""
    root, runner, kernel = ctx.root, ctx.runner, ctx.target.kernel
    assert dt.stream is not None
    streams_named = " or ".join(s for s in (dt.precompiled_stream, dt.stream) if s)

    def installed() -> Choice | None:
        """The host's choice when it is on the target (for DKMS: built for the kernel)."""
        state = cmd.module_state(root)
        if state.state != "enabled" or state.stream is None:
            return None
        if state.stream not in (dt.stream, dt.precompiled_stream):
            return None
        fm = list(cmd.FM_PACKAGES) if dt.fabric else []
        found = cmd.installed_versions(
            root, runner, [*dt.userspace, dt.kmod, dt.other_kmod, *fm])
        if dt.other_kmod in found or not set(dt.userspace) <= set(found):
            return None
        versions_found = {found[n] for n in dt.userspace}
        if len(versions_found) != 1:
            return None
        version = versions_found.pop()
        if dt.pinned and version != dt.pinned:
            return None
        if any(found.get(name) != version for name in dt.fabricmanager(version)):
            return None
        if state.stream == dt.precompiled_stream:
            kmod = cmd.precompiled_kmod(version, kernel)
            if dt.kmod in found or not cmd.all_installed(root, runner, [kmod]):
                return None
            return Choice(state.stream, version, kmod, True, "installed")
        built = root.local(cmd.dkms_built(dt.dkms_name, version, kernel))
        if found.get(dt.kmod) != version or not built.is_dir():
            return None
        if "nvidia" not in cmd.module_files(root, kernel):
            return None
        return Choice(state.stream, version, dt.kmod, False, "installed")

    def satisfied() -> bool:
        choice = installed()
        if choice is None:
            return False
        ctx.target.version = choice.version
        return True

    def apply() -> None:
        base = _base(ctx)
        before = cmd.installed_versions(root, runner, [dt.kmod])
        old_stream = cmd.module_state(root).stream
        try:
            runner.run(cmd.makecache_argv(base), stream=True, timeout=1800)
        except CommandFailed as exc:
            if any(marker in exc.output_tail for marker in _REPO_DOWN):
                raise _repo_down(ctx, exc.output_tail) from exc
            raise _transaction_failed("dnf makecache", exc.output_tail) from exc
        streams = dnf_metadata.read_cached(_cache_dir(ctx))
        if streams is None:
            raise ModuleMetadataMissing(
                f"no module metadata (modules.yaml) in the host's repos ({cmd.repos_tried(root)})"
            )
        choice = choose(dt, kernel, streams)
        ctx.target.version = choice.version
        log.info("dnf: %s %s from stream %s:%s (%s)", "installing", choice.version, cmd.MODULE,
                 choice.stream, choice.reason)
        first = cmd.last_transaction(root)
        try:
            runner.run(cmd.install_argv(base, dt, choice, kernel), stream=True, timeout=3600)
        except CommandFailed as exc:
            raise _install_error(ctx, choice, exc.output_tail) from exc
        done = cmd.last_transaction(root)
        try:
            if not choice.precompiled:
                _ensure_dkms(ctx, dt.dkms_name, choice.version)
            if "nvidia" not in cmd.module_files(root, kernel):
                raise InstallFailed(
                    f"after the transaction there is no nvidia module for kernel {kernel} under "
                    f"/lib/modules/{kernel}/extra ({choice.kmod})"
                )
            if installed() is None:
                raise InstallFailed(
                    f"dnf finished but the host is not on {choice.version} of stream "
                    f"{cmd.MODULE}:{choice.stream}"
                )
        except InstallerError:
            if done > first:
                _undo(ctx, dt.dkms_name, done, before.get(dt.kmod), old_stream)
            raise
        log.info("dnf: the host has %s %s (%s)", ", ".join(
            [*dt.userspace, *dt.fabricmanager(choice.version)]), choice.version, choice.kmod)

    return Step(
        "install-driver-packages",
        f"one dnf transaction from stream {cmd.MODULE}:{streams_named}"
        + (f" pinned to {dt.pinned}" if dt.pinned else "")
        + (f", profile {dt.profile} (Fabric Manager of the same version)" if dt.fabric else "")
        + "; DKMS streams with kernel-devel, then DKMS for the target kernel",
        satisfied,
        apply,
    )


def _install_error(ctx: Context, choice: Choice, output: str) -> InstallerError:
    if any(marker in output for marker in _REPO_DOWN):
        return _repo_down(ctx, output)
    if _NO_DKMS.search(output):
        return DkmsUnavailable(
            f"{choice.kmod} requires dkms, which none of the host's repos provides "
            f"({cmd.repos_tried(ctx.root)}); dkms comes from EPEL"
        )
    kernel = ctx.target.kernel
    missing = [p for p in cmd.kernel_packages(kernel) if f"{_NO_MATCH}: {p}" in output]
    if missing:
        return KernelHeadersMissing(
            f"{' and '.join(missing)} for kernel {kernel} is in none of the host's repos "
            f"(tried: {cmd.repos_tried(ctx.root)})",
            hint=f"DKMS needs kernel-devel for exactly the kernel {kernel}: enable the repo that "
            "has it (for an older minor release, the vault or the matching --releasever), boot "
            "a kernel whose kernel-devel is available, or use a precompiled stream; the host's "
            "packages were left as they were.",
        )
    return _transaction_failed(
        f"the dnf transaction for {choice.version} of stream {cmd.MODULE}:{choice.stream}", output
    )


def _ensure_dkms(ctx: Context, name: str, version: str) -> None:
    """The -dkms kmod's %post builds for the running kernel only and swallows every error:
    check DKMS's own status for the target kernel and install there when it did not. `name`
    is the kmod's DKMS module name (nvidia, or nvidia-open for the open flavour)."""
    root, runner, kernel = ctx.root, ctx.runner, ctx.target.kernel
    args = ["-m", name, "-v", version, "-k", kernel]
    status = runner.run(cmd.dkms_argv(root, "status", *args), check=False, timeout=120)
    if cmd.dkms_installed(status.output, name, version, kernel) and "nvidia" in cmd.module_files(
        root, kernel
    ):
        log.info("DKMS has %s %s installed for %s", name, version, kernel)
        return
    log.info("DKMS has not installed %s %s for %s: dkms install", name, version, kernel)
    try:
        runner.run(cmd.dkms_argv(root, "install", *args), stream=True, timeout=3600)
    except CommandFailed as exc:
        make_log = cmd.make_log(name, version)
        text = root.read_text(make_log) or "(no make.log)"
        tail = "\n".join(text.splitlines()[-25:])
        raise ModuleBuildFailed(
            f"DKMS could not build {name} {version} for kernel {kernel}: "
            f"{exc.output_tail.strip()}\n--- {make_log} (last lines) ---\n{tail}",
            hint=f"Check that kernel-devel-{kernel}, gcc and make on the host match the kernel; "
            "the driver transaction was undone, the host's packages are as they were.",
        ) from exc


def _undo(
    ctx: Context, name: str, transaction: int, old_kmod_version: str | None,
    old_stream: str | None,
) -> None:
    """Undo this run's transaction; the old -dkms build is rebuilt for the target kernel
    (the new package's %preun removed it from DKMS). The old stream is enabled first: while
    the new one is, modular filtering hides the old packages from the undo."""
    log.warning("undoing dnf transaction %d", transaction)
    if old_stream and old_stream != cmd.module_state(ctx.root).stream:
        ctx.runner.run(cmd.module_enable_argv(_base(ctx), old_stream), check=False, timeout=600)
    try:
        ctx.runner.run(cmd.undo_argv(_base(ctx), transaction), stream=True, timeout=3600)
    except CommandFailed as exc:
        log.error("could not undo dnf transaction %d: %s", transaction, exc.output_tail.strip())
        return
    if old_kmod_version:
        args = ["-m", name, "-v", old_kmod_version, "-k", ctx.target.kernel]
        ctx.runner.run(cmd.dkms_argv(ctx.root, "install", *args), check=False, timeout=3600)


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
    and the modules DKMS or the precompiled kmod put in /lib/modules/<k>/extra in the module
    cache, uncompressed (the `drivers` link, the insmod fallback). The modules stay where they
    are; depmod makes modprobe find them."""
    layout, t = ctx.layout, ctx.target

    def satisfied() -> bool:
        return is_complete(layout.version_dir(t.version)) and is_complete(
            layout.module_build(t.version, t.kernel, t.flavour))

    def apply() -> None:
        version = t.version
        present = cmd.installed_versions(ctx.root, ctx.runner, list(cmd.USERSPACE_ALL))
        userspace = sorted(n for n, v in present.items() if v == version)
        final = layout.version_dir(version)
        if not is_complete(final):
            _fill_version_dir(ctx, _package_files(ctx, userspace), final, version)
        build = layout.module_build(version, t.kernel, t.flavour)
        if not is_complete(build):
            _fill_module_dir(ctx, build)
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
    with staged_dir(final) as staging:
        (staging / "bin").mkdir()
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
            raise InstallFailed(
                f"the installed packages of {version} have no nvidia-smi (rpm -ql listed none)"
            )
        ctx.runner.run(["ldconfig", "-n", str(staging / "lib64")], timeout=120)
        mark_complete(staging, version + "\n")
    log.info("filled %s with %d files from the packages", final, count)


def _fill_module_dir(ctx: Context, build: Path) -> None:
    t = ctx.target
    found = cmd.module_files(ctx.root, t.kernel)
    if "nvidia" not in found:
        raise InstallFailed(
            f"no nvidia module for kernel {t.kernel} under /lib/modules/{t.kernel}/extra",
            hint="DKMS builds for the running kernel; check `dkms status` on the node and "
            "that kernel-devel matches the kernel.",
        )
    with staged_dir(build) as staging:
        for name, path in found.items():
            dest = staging / f"{name}.ko"
            if path.name.endswith(".ko.xz"):
                with lzma.open(path) as packed, open(dest, "wb") as out:
                    shutil.copyfileobj(packed, out)
            elif path.name.endswith(".ko.zst"):
                ctx.runner.run(["zstd", "-d", "-q", "-f", "-o", str(dest), str(path)],
                               timeout=120)
            else:
                _link_or_copy(path, dest)
        mark_complete(staging, f"{t.version} {t.kernel} {t.flavour}\n")


def _retire_runfile_modules(ctx: Context) -> None:
    """A runfile install's modules sit in updates/, which modprobe prefers over extra/."""
    ours = ctx.root.local(ctx.layout.host_modules_dir(ctx.target.kernel))
    if ours.exists():
        remove_tree(ours)
        log.info("removed the runfile install's modules in %s", ours)


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)
