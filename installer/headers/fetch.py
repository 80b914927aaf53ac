"""Where the target kernel's headers come from, and fetching them once into the cache."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from installer import kernel
from installer.config import Config
from installer.errors import CommandFailed, HeadersFetchFailed
from installer.headers import apt, dnf
from installer.host import HostFacts
from installer.hostroot import HostRoot
from installer.kernel import Headers
from installer.layout import Layout
from installer.runner import Runner

log = logging.getLogger(__name__)

COMPLETE = ".complete"


def cache_dir(layout: Layout, release: str) -> Path:
    """`<cache>/headers/<kernel>/`: `root/` holds the unpacked packages, kept across runs."""
    return layout.cache_local / "headers" / release


def cached(layout: Layout, release: str) -> Headers | None:
    """Headers fetched by an earlier run (complete ones only). Reads only."""
    final = cache_dir(layout, release)
    if not (final / COMPLETE).is_file():
        return None
    return kernel.find_unpacked_headers(final / "root", release)


def shown(url: str) -> str:
    """A URL without its userinfo, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass(frozen=True)
class SourcePlan:
    """How missing headers will be fetched: `tool` (apt-get|dnf) or None when they cannot be."""

    tool: str | None
    package: str
    where: str


def plan_source(root: HostRoot, config: Config, facts: HostFacts) -> SourcePlan:
    """Decide from configuration alone (no network) where the headers would come from."""
    family = facts.distro.family
    release = facts.kernel_release
    package = kernel.headers_package(family, release)
    if config.fetch_headers == "false":
        return SourcePlan(None, package, "fetching is off (NVIDIA_INSTALLER_FETCH_HEADERS=false)")
    tool = "apt-get" if family == "debian" else "dnf"
    files = apt.source_files(root) if family == "debian" else dnf.repo_files(root)
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
    vault = ""
    if facts.distro.id == "rocky" and config.rocky_vault:
        vault = (f" and Rocky's vault for "
                 f"{dnf.kernel_minor(release, facts.distro)} ({shown(config.rocky_vault)})")
    if not files and not vault:
        where = "/etc/apt/sources.list(.d)" if family == "debian" else "/etc/yum.repos.d"
        return SourcePlan(None, package, f"the host has no package sources ({where} is empty)")
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
        raise kernel.missing_headers_error(release, family, tried=source.where)
    final = cache_dir(layout, release)
    work = final.with_name(f".{release}.tmp")
    _remove(work)
    work.mkdir(parents=True)
    try:
        if family == "debian":
            packages = _fetch_apt(root, config, facts, work, runner, source)
        else:
            packages = _fetch_dnf(root, config, facts, work, runner, source)
        if kernel.find_unpacked_headers(work / "root", release) is None:
            raise kernel.missing_headers_error(
                release, family, tried=f"{', '.join(packages)} from {source.where} hold no "
                "header tree for this kernel")
        for name in os.listdir(work):
            if name != "root":
                _remove(work / name)
        (work / COMPLETE).write_text("\n".join(packages) + "\n")
        _remove(final)
        os.replace(work, final)
    except BaseException:
        _remove(work)
        raise
    log.info("kernel headers for %s: %s from %s, unpacked into %s", release,
             ", ".join(packages), source.where, final)
    found = cached(layout, release)
    assert found is not None
    return found


def _fetch_apt(root: HostRoot, config: Config, facts: HostFacts, work: Path, runner: Runner,
               source: SourcePlan) -> list[str]:
    private = apt.prepare(root, work / "apt", facts.arch, config.headers_mirror)
    updated = apt.update(runner, private)
    packages = apt.header_packages(runner, private, source.package)
    if packages is None:
        raise kernel.missing_headers_error(
            facts.kernel_release, facts.distro.family,
            tried=f"no source has it; tried {source.where}; apt-get update said:\n"
            + updated.tail(15))
    try:
        debs = apt.download(runner, private, packages, work / "debs")
        for deb in debs:
            runner.run(apt.unpack_argv(deb, work / "root"), timeout=600)
    except CommandFailed as exc:
        raise HeadersFetchFailed(f"fetching {', '.join(packages)} from {source.where} failed: "
                                 f"{exc}") from exc
    return packages


def _fetch_dnf(root: HostRoot, config: Config, facts: HostFacts, work: Path, runner: Runner,
               source: SourcePlan) -> list[str]:
    private = dnf.prepare(root, work / "dnf", facts.distro, facts.kernel_release,
                          mirror=config.headers_mirror, vault=config.rocky_vault)
    rpms_dir = work / "rpms"
    result = dnf.download(runner, private, source.package, rpms_dir)
    rpms = sorted(rpms_dir.glob("*.rpm"))
    if not rpms:
        raise kernel.missing_headers_error(
            facts.kernel_release, facts.distro.family,
            tried=f"no source has it; tried {source.where}; dnf said:\n" + result.tail(15))
    try:
        if private.keys:
            checked = [runner.run(argv, timeout=300) for argv in dnf.verify_argvs(private, rpms)]
            unsigned = [line for line in checked[-1].output.splitlines()
                        if line.strip() and "signatures OK" not in line]
            if unsigned:
                raise HeadersFetchFailed(
                    f"{source.package} from {source.where} is not signed by a key the host's "
                    "repos trust:\n" + "\n".join(unsigned))
        (work / "root").mkdir(exist_ok=True)
        for rpm in rpms:
            runner.run(dnf.unpack_argv(rpm, work / "root"), timeout=600)
    except CommandFailed as exc:
        raise HeadersFetchFailed(f"checking or unpacking {source.package} from {source.where} "
                                 f"failed: {exc}") from exc
    return [source.package]


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
