"""What the dnf source decides before it runs: the repo's evidence under auto, the
packages or streams a request maps to, what `plan` can say offline, the stream and version
chosen from the module metadata dnf cached."""

from __future__ import annotations

from pathlib import Path

from installer.config import Config
from installer.errors import ModuleMetadataMissing
from installer.host import Distro
from installer.hostroot import HostRoot
from installer.plan import Context, Decision
from installer.release import versions
from installer.sources.dnf import commands, metadata, repos
from installer.sources.dnf.commands import Choice, DnfTarget


def repo_evidence(root: HostRoot, config: Config) -> str | None:
    """Why the NVIDIA dnf repo counts as configured on this host, or None. Reads files only
    (no network: `plan` and the warm path stay offline)."""
    if config.dnf_repo_url:
        return "NVIDIA_DNF_REPO_URL is set"
    found = repos.nvidia_repo(root)
    if found is not None:
        return f"{repos.REPOS_DIR}/{found.file} provides NVIDIA's repo ({found.repo_id})"
    return None


def repo_url(config: Config, distro: Distro, arch: str) -> str:
    return config.dnf_repo_url or commands.family(distro).nvidia_repo_file(distro, arch)


def target_of(ctx: Context) -> DnfTarget:
    from installer.components import fabricmanager, nvlink5  # NVSwitch/NVLink5 nodes only

    request = versions.parse_request(ctx.config.version)
    t = ctx.target
    fabric = fabricmanager.applies(ctx)
    return commands.dnf_target(
        ctx.facts.distro, request.kind, request.value, t.version, t.branch, t.flavour,
        fabric=fabric,
        nvlsm=commands.nvlsm_spec(ctx.config.nvlsm_version) if fabric and nvlink5.applies(ctx)
        else None,
    )


def cache_dir(ctx: Context) -> Path:
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
    streams = metadata.read_cached(cache_dir(ctx))
    kernel = ctx.target.kernel
    if streams is None:
        options = " or ".join(s for s in (dt.precompiled_stream, dt.stream) if s)
        return [
            Decision(
                "dnf-stream",
                f"{commands.MODULE}:{options}",
                "chosen when run, from the repo's module metadata (not cached here yet): the "
                f"precompiled stream when NVIDIA ships a kmod for kernel {kernel}, else DKMS; "
                "the version is the stream's newest unless pinned",
            ),
            *_pending_version(ctx, dt, f"stream {commands.MODULE}:{options}"),
        ]
    try:
        choice = choose(dt, kernel, streams)
    except ModuleMetadataMissing as exc:
        ctx.target.version_pending = True
        return [Decision("dnf-stream", "unavailable", exc.message),
                Decision("version", "none", f"`run` fails: {exc.message}")]
    ctx.target.version = choice.version
    return [
        Decision("dnf-stream", f"{commands.MODULE}:{choice.stream}", choice.reason),
        Decision(
            "version",
            choice.version,
            f"what dnf installs from stream {choice.stream} (the repo's cached module metadata)",
        ),
    ]


def _pending_version(ctx: Context, dt: DnfTarget, where: str) -> list[Decision]:
    """Unpinned, dnf installs the newest the repo offers, which is known only when run: the
    catalog's version (what the runfile source would install) is not named: dnf may install
    another."""
    if dt.pinned:
        return []
    ctx.target.version_pending = True
    return [Decision("version", f"the newest in {where}, chosen when run",
                     "dnf installs what the repo offers; its module metadata is not cached here "
                     "yet (the first run caches it, then plan names the version)")]


def choose(dt: DnfTarget, kernel: str, streams: metadata.Streams) -> Choice:
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
            f"the repo's module metadata has no stream {commands.MODULE}:{dt.stream}"
            + (f" or {pre}" if pre else "")
            + f" (streams there: {', '.join(sorted(streams.packages)) or 'none'})"
        )
    if pre and version in pre_versions:
        kmod = commands.precompiled_kmod(version, kernel)
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
            f"version {version} is not in stream {commands.MODULE}:{dt.stream} ({offered}) "
            f"and {why}"
        )
    return Choice(dt.stream, version, dt.kmod, False, f"DKMS stream {dt.stream}: {why}")


def base_argv(ctx: Context) -> list[str]:
    """The dnf argv every change to the host's packages starts with; writes the re-rooted
    copies of the host's repo files it names (only steps' apply calls it, never a plan)."""
    cache = ctx.layout.cache_local / "dnf"
    return commands.dnf_base(ctx.root, ctx.facts.distro, cache,
                             commands.host_repos_dir(ctx.root, cache))
