"""The dnf source's one transaction: version-locked packages (EL10) or a module stream
(EL8/9, precompiled or DKMS), DKMS made to build for the target kernel, and the transaction
undone when that fails."""

from __future__ import annotations

import logging

from installer.errors import (
    CommandFailed,
    InstallerError,
    InstallFailed,
    ModuleBuildFailed,
    ModuleMetadataMissing,
    PackageManagerFailed,
)
from installer.plan import Context, Step
from installer.sources.dnf import commands, host_state, metadata, repos
from installer.sources.dnf.commands import Choice, DnfTarget
from installer.sources.dnf.errors import (
    NO_MATCH,
    REPO_DOWN,
    install_error,
    repo_down,
    transaction_failed,
)
from installer.sources.dnf.plan import base_argv, cache_dir, choose

log = logging.getLogger(__name__)


def transaction_step(ctx: Context, dt: DnfTarget) -> Step:
    names = list(dt.packages)
    where = f"stream {commands.MODULE}:{dt.stream}" if dt.stream else "packages (EL10: no streams)"
    what = f"version {dt.pinned}" if dt.pinned else "the newest version"

    def installed_version() -> str | None:
        """The one version of every wanted package when the host is on the target, else
        None. Adopts it as the target version when the stream decides."""
        if dt.stream is not None:
            state = host_state.module_state(ctx.root)
            if state.stream != dt.stream or state.state != "enabled":
                return None
        found = host_state.installed_versions(ctx.root, ctx.runner, [*names, dt.other_kmod])
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
        lock = dt.stream is None and not ctx.root.local(commands.VERSIONLOCK_CONF).is_file()
        argv = commands.transaction_argv(base_argv(ctx), dt, with_versionlock=lock)
        log.info("dnf: %s of %s", what, where)
        try:
            ctx.runner.run(argv, stream=True, timeout=3600)
        except CommandFailed as exc:
            output = exc.output_tail
            if any(marker in output for marker in REPO_DOWN):
                raise repo_down(ctx, output) from exc
            if NO_MATCH in output and dt.pinned:
                raise PackageManagerFailed(
                    f"version {dt.pinned} is not in {where} of the host's repos "
                    f"({repos.repos_tried(ctx.root)}); dnf said:\n{output.strip()}",
                    hint="Pick a version the repo has (`dnf module info nvidia-driver:"
                    f"{dt.stream}`), or a branch; the host's packages were left as they were.",
                ) from exc
            raise transaction_failed(f"the dnf transaction for {what} of {where}", output) from exc
        version = installed_version()
        if version is None:
            raise InstallFailed(
                f"dnf finished but the host is not on {what} of {where} ({', '.join(names)})"
            )
        ctx.target.version = version
        _ensure_dkms(ctx, dt.dkms_name(version), version)
        log.info("dnf: the host has %s %s", ", ".join(names), version)

    return Step(
        "install-driver-packages", f"one dnf transaction: {what} of {where}", satisfied, apply
    )


def stream_transaction_step(ctx: Context, dt: DnfTarget) -> Step:
    """EL8/9: one transaction to the chosen stream and version (with kernel-devel for DKMS),
    then DKMS made to install for the target kernel; a DKMS failure undoes the transaction."""
    root, runner, kernel = ctx.root, ctx.runner, ctx.target.kernel
    assert dt.stream is not None
    streams_named = " or ".join(s for s in (dt.precompiled_stream, dt.stream) if s)

    def installed() -> Choice | None:
        """The host's choice when it is on the target (for DKMS: built for the kernel)."""
        state = host_state.module_state(root)
        if state.state != "enabled" or state.stream is None:
            return None
        if state.stream not in (dt.stream, dt.precompiled_stream):
            return None
        fm = list(commands.FM_PACKAGES) if dt.fabric else []
        found = host_state.installed_versions(
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
            kmod = commands.precompiled_kmod(version, kernel)
            if dt.kmod in found or not host_state.all_installed(root, runner, [kmod]):
                return None
            return Choice(state.stream, version, kmod, True, "installed")
        built = root.local(host_state.dkms_built(dt.dkms_name(version), version, kernel))
        if found.get(dt.kmod) != version or not built.is_dir():
            return None
        if "nvidia" not in host_state.module_files(root, kernel):
            return None
        return Choice(state.stream, version, dt.kmod, False, "installed")

    def satisfied() -> bool:
        choice = installed()
        if choice is None:
            return False
        ctx.target.version = choice.version
        return True

    def apply() -> None:
        base = base_argv(ctx)
        before = host_state.installed_versions(root, runner, [dt.kmod])
        old_stream = host_state.module_state(root).stream
        try:
            runner.run(commands.makecache_argv(base), stream=True, timeout=1800)
        except CommandFailed as exc:
            if any(marker in exc.output_tail for marker in REPO_DOWN):
                raise repo_down(ctx, exc.output_tail) from exc
            raise transaction_failed("dnf makecache", exc.output_tail) from exc
        streams = metadata.read_cached(cache_dir(ctx))
        if streams is None:
            raise ModuleMetadataMissing(
                f"no module metadata (modules.yaml) in the host's repos ({repos.repos_tried(root)})"
            )
        try:
            choice = choose(dt, kernel, streams)
        except ModuleMetadataMissing as exc:
            raise commands.family(ctx.facts.distro).driver_missing(exc.message) from None
        ctx.target.version = choice.version
        log.info("dnf: %s %s from stream %s:%s (%s)", "installing", choice.version, commands.MODULE,
                 choice.stream, choice.reason)
        first = host_state.last_transaction(root)
        try:
            runner.run(commands.install_argv(base, dt, choice, kernel, ctx.facts.distro),
                       stream=True, timeout=3600)
        except CommandFailed as exc:
            raise install_error(ctx, choice, exc.output_tail) from exc
        done = host_state.last_transaction(root)
        try:
            if not choice.precompiled:
                _ensure_dkms(ctx, dt.dkms_name(choice.version), choice.version)
            if "nvidia" not in host_state.module_files(root, kernel):
                raise InstallFailed(
                    f"after the transaction there is no nvidia module for kernel {kernel} under "
                    f"/lib/modules/{kernel}/extra ({choice.kmod})"
                )
            if installed() is None:
                raise InstallFailed(
                    f"dnf finished but the host is not on {choice.version} of stream "
                    f"{commands.MODULE}:{choice.stream}"
                )
        except InstallerError:
            if done > first:
                _undo(ctx, dt, done, before.get(dt.kmod), old_stream)
            raise
        log.info("dnf: the host has %s %s (%s)", ", ".join(
            [*dt.userspace, *dt.fabricmanager(choice.version)]), choice.version,
                 choice.kmod)

    return Step(
        "install-driver-packages",
        f"one dnf transaction from stream {commands.MODULE}:{streams_named}"
        + (f" pinned to {dt.pinned}" if dt.pinned else "")
        + (f", profile {dt.profile} (Fabric Manager of the same version)" if dt.fabric else "")
        + "; DKMS streams with kernel-devel, then DKMS for the target kernel",
        satisfied,
        apply,
    )


def _ensure_dkms(ctx: Context, name: str, version: str) -> None:
    """The -dkms kmod's %post builds for the running kernel only and swallows every error:
    check DKMS's own status for the target kernel and install there when it did not. `name`
    is the kmod's DKMS module name (nvidia, or nvidia-open for the open flavour before
    570.148.08)."""
    root, runner, kernel = ctx.root, ctx.runner, ctx.target.kernel
    args = ["-m", name, "-v", version, "-k", kernel]
    status = runner.run(commands.dkms_argv(root, "status", *args), check=False, timeout=120)
    if (host_state.dkms_installed(status.output, name, version, kernel)
            and "nvidia" in host_state.module_files(root, kernel)):
        log.info("DKMS has %s %s installed for %s", name, version, kernel)
        return
    log.info("DKMS has not installed %s %s for %s: dkms install", name, version, kernel)
    try:
        runner.run(commands.dkms_argv(root, "install", *args), stream=True, timeout=3600)
    except CommandFailed as exc:
        make_log = host_state.make_log(name, version)
        text = root.read_text(make_log) or "(no make.log)"
        tail = "\n".join(text.splitlines()[-25:])
        raise ModuleBuildFailed(
            f"DKMS could not build {name} {version} for kernel {kernel}: "
            f"{exc.output_tail.strip()}\n--- {make_log} (last lines) ---\n{tail}",
            hint=f"Check that {commands.kernel_packages(kernel, ctx.facts.distro)[0]}, gcc and "
            "make on the host match the kernel; the driver transaction was undone, the host's "
            "packages are as they were.",
        ) from exc


def _undo(
    ctx: Context, dt: DnfTarget, transaction: int, old_kmod_version: str | None,
    old_stream: str | None,
) -> None:
    """Undo this run's transaction; the old -dkms build is rebuilt for the target kernel
    (the new package's %preun removed it from DKMS), under the name the old version's kmod
    registers with DKMS. The old stream is enabled first: while
    the new one is, modular filtering hides the old packages from the undo."""
    log.warning("undoing dnf transaction %d", transaction)
    if old_stream and old_stream != host_state.module_state(ctx.root).stream:
        ctx.runner.run(commands.module_enable_argv(base_argv(ctx), old_stream), check=False,
                       timeout=600)
    try:
        ctx.runner.run(commands.undo_argv(base_argv(ctx), transaction), stream=True, timeout=3600)
    except CommandFailed as exc:
        log.error("could not undo dnf transaction %d: %s", transaction, exc.output_tail.strip())
        return
    if old_kmod_version:
        name = dt.dkms_name(old_kmod_version)
        args = ["-m", name, "-v", old_kmod_version, "-k", ctx.target.kernel]
        ctx.runner.run(commands.dkms_argv(ctx.root, "install", *args), check=False, timeout=3600)
