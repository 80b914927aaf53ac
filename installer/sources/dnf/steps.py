"""The RHEL family's packages: NVIDIA's CUDA repo, then one dnf transaction against the host's
rpm database (`dnf_transaction.py`), the install dir filled from the packages' files
(`dnf_populate.py`). This module lists the steps in order and holds the small ones: the repo
file, kernel-devel, EPEL and the EL10 version lock."""

from __future__ import annotations

import logging

from installer.errors import CommandFailed, DownloadFailed, RepoUnavailable, RepoUrlInsecure
from installer.plan import Context, Step
from installer.sources.dnf import commands, host_state, repos
from installer.sources.dnf.commands import DnfTarget
from installer.sources.dnf.errors import kernel_error, transaction_failed
from installer.sources.dnf.plan import base_argv, repo_url, target_of
from installer.sources.dnf.populate import populate_step
from installer.sources.dnf.transaction import stream_transaction_step, transaction_step
from installer.steps import driver_free_before_packages_step

log = logging.getLogger(__name__)

REPO_FILE_MAX_BYTES = 256 << 10


def dnf_steps(ctx: Context) -> list[Step]:
    """add-dnf-repo, [enable-epel], install-driver-packages (EL8/9: one transaction with
    kernel-devel, then DKMS for the target kernel), or on EL10 install-kernel-devel,
    install-driver-packages, lock-driver-version; then populate-install-dir. When the driver
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
    if dt.fabric:  # Fabric Manager came with the fm profile
        from installer.sources.dnf import fabricmanager

        plan.append(fabricmanager.install_step(ctx))
        from installer.components import nvlink5

        if nvlink5.applies(ctx):  # an NVLink5 node: NVLSM runs before that Fabric Manager
            from installer.sources.dnf import nvlsm

            plan.append(nvlsm.install_step(ctx))
    return plan


def repo_step(ctx: Context) -> Step:
    distro = ctx.facts.distro
    url = repo_url(ctx.config, distro, ctx.facts.arch)
    own = commands.family(distro).nvidia_repo_file(distro, ctx.facts.arch).rsplit("/", 1)[-1]
    dest = repos.REPOS_DIR / repos.repo_file_name(url, own)

    def host_file() -> str | None:
        """The host's repo file this step would rely on instead of writing one."""
        if ctx.root.local(dest).is_file():
            return dest.name
        found = None if ctx.config.dnf_repo_url else repos.nvidia_repo(ctx.root)
        return found.file if found is not None else None

    def unsigned() -> repos.RepoEntry | None:
        """A host NVIDIA repo section dnf would read without gpgcheck: refused, never edited."""
        file = host_file()
        chosen = repos.unsigned_host_repo(ctx.root, file) if file is not None else None
        return chosen or repos.unsigned_host_repo(ctx.root)

    def satisfied() -> bool:
        return host_file() is not None and unsigned() is None

    def apply() -> None:
        from installer import delivery

        weak = unsigned()
        if weak is not None:
            raise repos.refuse_unsigned_host_repo(weak)
        if host_file() is not None:
            return  # the host's own signed repo: never replaced
        settings = delivery.DownloadSettings(
            retries=ctx.config.retries,
            connect_timeout=ctx.config.connect_timeout,
            read_timeout=ctx.config.read_timeout,
            progress="none",
        )
        shown = delivery.redact_url(url)
        if not url.startswith(("https://", "file://")):
            raise RepoUrlInsecure(f"NVIDIA_DNF_REPO_URL {shown} is not https:// or file://: a "
                                  ".repo file decides which signing key dnf trusts")
        try:
            # https_only: a redirect to plain http would let the network choose the signing
            # key and baseurl dnf trusts; a file:// .repo is the operator's own and stays allowed.
            data = delivery.fetch_bytes(url, settings, max_bytes=REPO_FILE_MAX_BYTES,
                                        https_only=url.startswith("https://"))
        except DownloadFailed as exc:
            raise RepoUnavailable(f"cannot fetch the dnf repo file {shown}: {exc.message}") from exc
        text = data.decode("utf-8", errors="replace")
        host_ids = {e.repo_id: e.file for e in repos.repo_entries(ctx.root)}
        repo_id = repos.check_repo_file(text, shown, local=url.startswith("file://"),
                                        host_ids=host_ids)
        ctx.root.local(repos.REPOS_DIR).mkdir(parents=True, exist_ok=True)
        ctx.root.write_atomic(dest, text)
        log.info("added %s (%s) from %s", dest, repo_id, shown)

    return Step(
        "add-dnf-repo", f"NVIDIA's repo file as {dest} unless one is there", satisfied, apply
    )


def kernel_devel_step(ctx: Context) -> Step:
    kernel = ctx.target.kernel
    packages = commands.kernel_packages(kernel, ctx.facts.distro)

    def satisfied() -> bool:
        return host_state.all_installed(ctx.root, ctx.runner, packages)

    def apply() -> None:
        try:
            ctx.runner.run(commands.kernel_argv(base_argv(ctx), kernel, ctx.facts.distro),
                           stream=True, timeout=1800)
        except CommandFailed as exc:
            raise kernel_error(ctx, kernel, exc) from exc

    return Step(
        "install-kernel-devel",
        f"{' and '.join(packages)} (DKMS builds against them)",
        satisfied,
        apply,
    )


def epel_step(ctx: Context) -> Step:
    """NVIDIA_DNF_ENABLE_EPEL: epel-release from the host's repos (Rocky: extras), for dkms."""

    def satisfied() -> bool:
        entries = repos.repo_entries(ctx.root)
        enabled = any(e.enabled and e.repo_id.startswith("epel") for e in entries)
        return enabled or host_state.all_installed(ctx.root, ctx.runner, ["dkms"])

    def apply() -> None:
        try:
            ctx.runner.run(commands.epel_argv(base_argv(ctx)), stream=True, timeout=1800)
        except CommandFailed as exc:
            raise RepoUnavailable(
                "NVIDIA_DNF_ENABLE_EPEL is set but epel-release could not be installed from the "
                f"host's repos ({repos.repos_tried(ctx.root)}); dnf said:\n"
                f"{exc.output_tail.strip()}",
                hint="Enable the repo that has epel-release (Rocky: extras) or add EPEL yourself.",
            ) from exc

    return Step("enable-epel", "epel-release unless an EPEL repo is enabled (for dkms)",
                satisfied, apply)


def versionlock_step(ctx: Context, dt: DnfTarget) -> Step:
    """EL10 has no streams: keep `dnf update` from moving the driver with a version lock."""

    def wanted() -> list[str]:
        return [f"{name}-{ctx.target.version}" for name in dt.packages]

    def satisfied() -> bool:
        text = ctx.root.read_text(commands.VERSIONLOCK_LIST) or ""
        return all(_locked(text, name, ctx.target.version) for name in dt.packages)

    def apply() -> None:
        base = base_argv(ctx)
        ctx.runner.run([*base, "versionlock", "delete", *dt.packages], check=False, timeout=300)
        try:
            ctx.runner.run(
                commands.versionlock_argv(base, dt.packages, ctx.target.version),
                stream=True,
                timeout=300,
            )
        except CommandFailed as exc:
            raise transaction_failed("dnf versionlock add", exc.output_tail) from exc
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
