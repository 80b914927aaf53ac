"""The runfile source (NVIDIA's .run, built here or pulled prebuilt): its answers to the source
protocol and its plan decisions (download, headers and compiler)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from installer.config import Config
from installer.delivery import redact_url
from installer.headers import compiler, fetch, trees
from installer.headers import steps as header_steps
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.plan import Context, Decision, Headers, Step
from installer.release import download, versions
from installer.runner import Runner
from installer.sources.runfile import steps
from installer.sources.source import Arrival, Groundwork, Source

if TYPE_CHECKING:
    from installer.host import HostFacts


class RunfileSource(Source):
    name = "runfile"
    builds_modules = True

    def reason(self, config: Config, facts: HostFacts, passed_over: Sequence[str]) -> str:
        if config.source == self.name:
            return f"NVIDIA_DRIVER_SOURCE={self.name}"
        if passed_over:
            return (f"NVIDIA's .run for {facts.distro} (NVIDIA_DRIVER_SOURCE=auto: "
                    f"{'; '.join(passed_over)})")
        return f"NVIDIA's .run for {facts.distro} (NVIDIA_DRIVER_SOURCE={config.source})"

    def arrival(self, ground: Groundwork) -> Arrival:
        config, facts = ground.config, ground.facts
        default_url = versions.runfile_url(ground.version, facts.arch, config.branch_path,
                                           catalog=ground.catalog)
        urls = download.download_urls(config, ground.version, facts.arch, default_url)
        decisions = [Decision("download", redact_url(urls[0]), _url_reason(config, urls))]
        name = download.runfile_name(ground.version, facts.arch)
        decisions.append(Decision("runfile-digest", name, "its SHA-256 from " + (
            download.digest_source(config, name, [u + ".sha256sum" for u in urls]))))
        headers = (trees.find_headers(ground.root, facts.kernel_release)
                   or fetch.cached(ground.layout, facts.kernel_release)
                   or trees.find_container_headers(facts.kernel_release))
        decisions += header_decisions(config, ground.root, ground.layout, ground.runner, facts,
                                      headers, ground.running)
        return Arrival(decisions, urls, headers)

    def decisions(self, ctx: Context, decided: list[Decision]) -> list[Decision]:
        from installer.sources.prebuilt import modules, userspace  # registry artifacts

        found = modules.decision(ctx)
        user_space = userspace.decision(ctx, found)
        return [*decided, *(d for d in (found, user_space) if d is not None)]

    def steps(self, ctx: Context) -> list[Step]:
        return runfile_steps(ctx)


def _url_reason(config: Config, urls: list[str]) -> str:
    if config.download_url:
        return "NVIDIA_DRIVER_DOWNLOAD_URL"
    tried = ", ".join(redact_url(url) for url in urls)
    return f"tried in order: {tried}" if len(urls) > 1 else "default location"


def header_decisions(config: Config, root: HostRoot, layout: Layout, runner: Runner,
                     facts: HostFacts, headers: Headers | None,
                     running: str) -> list[Decision]:
    """Where the headers and the compiler come from, or why they cannot be had: a build needs
    both, matching the kernel."""
    release = facts.kernel_release
    major: int | None = None
    gcc_from = ""
    if headers is None:
        source = fetch.plan_source(root, config, facts)
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
    # The source and output paths nvidia-installer is given, and why.
    paths = header_steps.path_decisions(headers)
    if major is None and release == running:
        major = compiler.kernel_gcc_major(root.read_text("/proc/version"))
        gcc_from = "/proc/version"
    if major is None:
        return [first, *paths, Decision("compiler", "from the headers",
                                "the kernel's gcc is read from the headers' config once they "
                                "are fetched; checked before the driver download")]
    chosen = compiler.choose(runner, major)
    package = compiler.installable(major, config.compiler_packages) if chosen is None else None
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


def runfile_steps(ctx: Context) -> list[Step]:
    from installer.sources.prebuilt import modules, userspace  # registry artifacts

    # Prebuilt modules first (they make headers and a compiler unnecessary), then the user space
    # from the registry (with both, the .run is never downloaded), then headers and compiler: a
    # node that cannot build fails before the large download.
    return [*modules.pull_steps(ctx), *userspace.pull_steps(ctx),
            steps.headers_step(ctx), steps.compiler_step(ctx), steps.fetch_step(ctx),
            steps.extract_step(ctx), steps.build_step(ctx), *modules.publish_steps(ctx),
            steps.userspace_step(ctx), *userspace.publish_steps(ctx)]
