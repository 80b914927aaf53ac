"""Builds the plan: reads host facts, decides version, flavour, source and paths, lists steps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from installer import (
    catalog,
    compiler,
    components,
    distros,
    gate_steps,
    host,
    kernel,
    prefetch,
    steps,
    versions,
)
from installer.config import Config, check_build_path
from installer.delivery.urls import redact_url
from installer.errors import ConfigError, NoNvidiaGpu
from installer.headers import fetch as header_fetch
from installer.headers import steps as header_steps
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.plan import Context, Decision, Plan, Step, Target
from installer.runner import Runner
from installer.sources import runfile

FetchBytes = Callable[[str], bytes]
FetchRunfile = Callable[[list[str], Path, str], Path]


def make_plan(
    config: Config,
    runner: Runner,
    *,
    fetch_bytes: FetchBytes,
    fetch_runfile: FetchRunfile,
) -> Plan:
    """Decide everything `run` will do. Reads the host, changes nothing.

    Raises the errors of host detection and version resolution (unsupported-distro,
    invalid-version, unsupported-gpu, incompatible-gpus, catalog-unavailable, ...).
    """
    root = HostRoot(config.root)
    layout = Layout.from_config(config, root)
    # Host symlinks may lead the install dir or cache somewhere make would misread.
    check_build_path("the install dir as reached here", layout.install_local)
    check_build_path("the cache dir as reached here", layout.cache_local)
    facts = host.gather(root, kernel_override=config.kernel_release,
                        free_space_path=layout.install_local)
    running = host.kernel_release(root)
    decisions: list[Decision] = []
    blockers: list[str] = []

    shipped_or_custom = catalog.load(config.catalog, fetch_bytes)
    resolution = versions.resolve(config.version, shipped_or_custom, facts.gpus,
                                  module_type=config.module_type, track=config.track)
    decisions.append(Decision("version", resolution.version, "; ".join(resolution.reasons)))
    decisions.append(Decision("kernel-module-type", resolution.flavour,
                              _flavour_reason(config.module_type, resolution.flavour)))

    build_ahead = facts.kernel_release != running
    load = bool(facts.gpus) and not build_ahead
    if build_ahead:
        decisions.append(Decision("kernel", facts.kernel_release,
                                  f"building ahead for {facts.kernel_release} (running: {running})"
                                  "; modules are built and installed, not loaded"))
    else:
        decisions.append(Decision("kernel", facts.kernel_release, "the running kernel"))
    if not facts.gpus:
        if config.allow_no_gpu:
            decisions.append(Decision("gpus", "none", "no NVIDIA GPU found; installing ahead "
                                      "of attaching GPUs (allow-no-gpu): nothing is loaded"))
        else:
            blockers.append("no NVIDIA GPU found in /sys/bus/pci/devices")

    source = _choose_source(config, facts)
    decisions.append(Decision("source", source, _source_reason(config, facts, source)))
    urls: list[str] = []
    headers = None
    if source == "runfile":
        default_url = versions.runfile_url(resolution.version, facts.arch, config.branch_path,
                                           catalog=shipped_or_custom)
        urls = prefetch.download_urls(config, resolution.version, facts.arch, default_url)
        decisions.append(Decision("download", redact_url(urls[0]), _url_reason(config, urls)))
        headers = (kernel.find_headers(root, facts.kernel_release)
                   or header_fetch.cached(layout, facts.kernel_release)
                   or kernel.find_container_headers(facts.kernel_release))
        decisions += header_decisions(config, root, layout, runner, facts, headers, running)
    else:
        package = distros.of(facts.distro).headers_package(facts.kernel_release)
        decisions.append(Decision("kernel-headers", package,
                                  "installed through dnf for exactly the target kernel"))
    decisions.append(Decision("install-dir", str(layout.install_host),
                              f"NVIDIA_INSTALL_DIR_HOST, reached here at {layout.install_local}"))

    target = Target(
        version=resolution.version,
        branch=resolution.branch,
        flavour=resolution.flavour,
        kernel=facts.kernel_release,
        source=source,
        urls=urls,
        headers=headers,
        load=load,
        gpu_addresses=tuple(g.address for g in facts.gpus),
    )
    ctx = Context(config, root, layout, runner, facts, target, fetch_runfile)
    if source == "runfile":
        from installer.sources import prebuilt  # issue 14

        found = prebuilt.decision(ctx)
        if found is not None:
            decisions.append(found)
    if source == "dnf":
        from installer.sources import dnf  # only where it can be the source (warm path)

        # Issue 10: the stream and version dnf will install replace the catalog's version.
        extra = dnf.plan_decisions(ctx)
        topics = {d.topic for d in extra}
        decisions = [d for d in decisions if d.topic not in topics] + extra
    decisions += components.decisions(ctx)  # issue 21: Fabric Manager on NVSwitch nodes
    return Plan(ctx, decisions, _steps(ctx), blockers)


def _steps(ctx: Context) -> list[Step]:
    load = ctx.target.load
    plan = [steps.secure_boot_step(ctx)]
    gate = load and ctx.config.scheduling_gate  # issue 21: tainted while not ready
    if gate:
        plan.append(gate_steps.close_step(ctx))
    if load:
        plan.append(steps.nouveau_step(ctx))
    # dnf source (issue 4): the kmod package owns /lib/modules/<k>/extra, so no
    # install-module-files; the packages' files fill versions/<ver> instead of nvidia-installer.
    dnf_source = ctx.target.source == "dnf"
    if dnf_source:
        from installer.sources import dnf

        plan += dnf.dnf_steps(ctx)
    else:
        plan += runfile.runfile_steps(ctx)
    plan += components.steps(ctx)  # issue 21: beside the user space in versions/<ver>
    # Stage everything on the host first, so the old driver is unloaded and the new one
    # loaded back to back (issue 9).
    if load and not dnf_source:  # dnf checks before its packages change (dnf_steps)
        plan.append(steps.driver_free_step(ctx))
    if not dnf_source:
        plan += [steps.module_files_step(ctx), steps.firmware_step(ctx)]
    if load:
        plan.append(steps.unload_old_step(ctx))
    plan.append(steps.activate_step(ctx))
    plan.append(steps.ld_cache_step(ctx))
    if load:
        plan += [steps.load_step(ctx), steps.device_nodes_step(ctx), steps.verify_step(ctx)]
    plan += [steps.record_step(ctx), steps.prune_step(ctx)]
    if gate:
        plan.append(gate_steps.open_step(ctx))
    return plan


def require_gpus(plan: Plan) -> None:
    if plan.blockers:
        raise NoNvidiaGpu("; ".join(plan.blockers))


def require_go_ahead(plan: Plan) -> None:
    """Raise what refuses this plan outright (read-only: nothing on the host has changed)."""
    require_gpus(plan)
    refusal = steps.secure_boot_refusal(plan.context)
    if refusal is not None:
        raise refusal


def _flavour_reason(setting: str, flavour: str) -> str:
    if setting != "auto":
        return f"NVIDIA_KERNEL_MODULE_TYPE={setting}"
    return f"{flavour}: chosen by NVIDIA's rules for the GPUs found (see version reasons)"


def _choose_source(config: Config, facts: host.HostFacts) -> str:
    # Issue 4: dnf on the RHEL family when NVIDIA's repo is configured (offline check).
    offered = distros.of(facts.distro).package_sources
    if config.source == "dnf":
        if "dnf" not in offered:
            raise ConfigError(
                f"NVIDIA_DRIVER_SOURCE=dnf needs a RHEL-family host (Rocky, RHEL, AlmaLinux); "
                f"this host is {facts.distro}",
                hint="Use NVIDIA_DRIVER_SOURCE=auto or runfile on this host.",
            )
        return "dnf"
    if config.source == "runfile" or "dnf" not in offered:
        return "runfile"
    from installer.sources import dnf

    return "dnf" if dnf.repo_evidence(HostRoot(config.root), config) else "runfile"


def _source_reason(config: Config, facts: host.HostFacts, source: str) -> str:
    if config.source == "runfile":
        return "NVIDIA_DRIVER_SOURCE=runfile"
    if source == "dnf":
        from installer.sources import dnf

        why = ("NVIDIA_DRIVER_SOURCE=dnf" if config.source == "dnf" else
               f"auto on {facts.distro}: "
               f"{dnf.repo_evidence(HostRoot(config.root), config)}")
        how = ("module streams nvidia-driver:<branch>|latest (precompiled, when NVIDIA ships a "
               "kmod for the exact kernel) or <branch>-dkms|-open|latest-dkms|open-dkms (DKMS)"
               if facts.distro.major < 10 else
               "packages with a version lock (EL10 has no module streams)")
        return f"{why}; the distro's packages through dnf: {how}"
    if "dnf" in distros.of(facts.distro).package_sources:
        return (f"NVIDIA's .run for {facts.distro} (NVIDIA_DRIVER_SOURCE=auto: no NVIDIA dnf "
                "repo in /etc/yum.repos.d and NVIDIA_DNF_REPO_URL unset)")
    return f"NVIDIA's .run for {facts.distro} (NVIDIA_DRIVER_SOURCE={config.source})"


def _url_reason(config: Config, urls: list[str]) -> str:
    if config.download_url:
        return "NVIDIA_DRIVER_DOWNLOAD_URL"
    tried = ", ".join(redact_url(url) for url in urls)
    return f"tried in order: {tried}" if len(urls) > 1 else "default location"


def header_decisions(config: Config, root: HostRoot, layout: Layout, runner: Runner,
                     facts: host.HostFacts, headers: kernel.Headers | None,
                     running: str) -> list[Decision]:
    """Where the headers and the compiler come from, or why they cannot be had (issue 12)."""
    release = facts.kernel_release
    major: int | None = None
    gcc_from = ""
    if headers is None:
        source = header_fetch.plan_source(root, config, facts)
        if source.tool is None:
            first = Decision("kernel-headers", "missing",
                             f"no headers for {release} on the host, in the cache or the image, "
                             f"and {source.package} cannot be fetched: {source.where}; "
                             "`run` fails before downloading the driver")
        else:
            first = Decision("kernel-headers", f"fetch {source.package}",
                             f"from {source.where} with the image's {source.tool}, before the "
                             f"driver download; unpacked into "
                             f"{layout.cache_host}/headers/{release} (the host's package "
                             "database is not touched)")
    else:
        if headers.unpacked_root is not None:
            where = f"fetched by an earlier run into {layout.cache_host}/headers/{release}"
            tree = headers.unpacked_root.joinpath(*headers.output_path.parts[1:])
        elif headers.in_container:
            where, tree = "in the image", Path(str(headers.output_path))
        else:
            where, tree = "on the host", root.local(headers.output_path)
        first = Decision("kernel-headers", str(headers.output_path), f"found {where}")
        major = compiler.headers_gcc_major(tree)
        gcc_from = "the headers' CONFIG_GCC_VERSION"
    # Issue 19: the source and output paths nvidia-installer is given, and why.
    paths = header_steps.path_decisions(headers)
    if major is None and release == running:
        major = compiler.kernel_gcc_major(root.read_text("/proc/version"))
        gcc_from = "/proc/version"
    if major is None:
        return [first, *paths, Decision("compiler", "from the headers",
                                "the kernel's gcc is read from the headers' config once they "
                                "are fetched; checked before the driver download")]
    chosen = compiler.choose(runner, major)
    package = compiler.installable(major) if chosen is None else None
    if package is not None:
        return [first, *paths, Decision("compiler", f"install {package.package}",
                                f"{package.describe()}; kernel built with gcc {major} "
                                f"({gcc_from}); gcc at {package.path}")]
    if chosen is None:
        error = compiler.missing_error(release, major, gcc_from, runner)
        return [first, *paths, Decision("compiler", "missing",
                                f"{error.message}; `run` fails before downloading the driver. "
                                f"{error.hint}")]
    return [first, *paths, Decision("compiler", chosen.env.get("CC", "gcc"),
                            f"{chosen.note}; kernel built with gcc {major} ({gcc_from})")]
