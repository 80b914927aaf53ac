"""Where the target kernel's headers come from, and fetching them once into the cache."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

from installer import distros
from installer.config import Config
from installer.dirs import is_complete, mark_complete, remove_tree, staged_dir
from installer.headers import trees
from installer.host import HostFacts
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.plan import Headers
from installer.runner import Runner

log = logging.getLogger(__name__)


def cache_dir(layout: Layout, release: str) -> Path:
    """`<cache>/headers/<kernel>/`: `root/` holds the unpacked packages, kept across runs."""
    return layout.cache_local / "headers" / release


def cached(layout: Layout, release: str) -> Headers | None:
    """Headers fetched by an earlier run (complete ones only). Reads only."""
    final = cache_dir(layout, release)
    if not is_complete(final):
        return None
    return trees.find_unpacked_headers(final / "root", release)


def shown(url: str) -> str:
    """A URL without its userinfo, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class SourcePlan(NamedTuple):
    """How missing headers will be fetched: `tool` (apt-get|dnf) or None when they cannot be."""

    tool: str | None
    package: str
    where: str


def plan_source(root: HostRoot, config: Config, facts: HostFacts) -> SourcePlan:
    """Decide from configuration alone (no network) where the headers would come from."""
    family = distros.of(facts.distro)
    release = facts.kernel_release
    package = family.headers_package(release)
    if config.fetch_headers == "false":
        return SourcePlan(None, package, "fetching is off (NVIDIA_INSTALLER_FETCH_HEADERS=false)")
    tool = family.image_tool
    files = family.source_files(root)
    names = ", ".join(str(f) for f in files)
    if shutil.which(tool) is None:
        return SourcePlan(None, package, f"this image has no {tool} to fetch {package} with")
    if config.headers_mirror:
        if not files:
            return SourcePlan(None, package, f"the mirror {shown(config.headers_mirror)} is set "
                              "but the host has no package sources to take suites or repo ids "
                              "from")
        return SourcePlan(tool, package, f"the mirror {shown(config.headers_mirror)} (in place "
                          f"of the URIs in {names})")
    archive = family.vault(config, facts.distro, release)
    vault = f" and {archive[0]} ({shown(archive[1])})" if archive else ""
    if not files and not vault:
        return SourcePlan(None, package, f"the host has no package sources "
                          f"({family.sources_where} is empty)")
    return SourcePlan(tool, package, f"the host's package sources ({names or 'none'}){vault}")


def obtain(root: HostRoot, config: Config, facts: HostFacts, layout: Layout,
           runner: Runner) -> Headers:
    """Fetch the headers packages through the host's sources (or the mirror) and unpack them
    into the cache; writes only under the install dir's cache.

    Raises KernelHeadersMissing (no source has them, naming the package, kernel and sources
    tried) or HeadersFetchFailed (a source has them but fetching or checking failed).
    """
    release, family = facts.kernel_release, facts.distro.family
    source = plan_source(root, config, facts)
    if source.tool is None:
        raise trees.missing_headers_error(release, family, tried=source.where)
    final = cache_dir(layout, release)
    with staged_dir(final, within=layout.anchor_for(final)) as work:
        try:
            wanted = distros.Facts(facts.distro, facts.kernel_release, facts.arch)
            packages = distros.of(facts.distro).fetch_headers(
                root, config, wanted, work, runner, source.package, source.where)
        except distros.PackageNotFound as exc:
            raise trees.missing_headers_error(release, family, tried=exc.detail) from None
        if trees.find_unpacked_headers(work / "root", release) is None:
            raise trees.missing_headers_error(
                release, family, tried=f"{', '.join(packages)} from {source.where} hold no "
                "header tree for this kernel")
        for name in os.listdir(work):
            if name != "root":
                remove_tree(work / name)
        mark_complete(work, "\n".join(packages) + "\n")
    log.info("kernel headers for %s: %s from %s, unpacked into %s", release,
             ", ".join(packages), source.where, final)
    found = cached(layout, release)
    assert found is not None
    return found
