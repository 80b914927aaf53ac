"""The Debian family's header fetch: the image's apt-get reading the host's sources and keys with
a private state and cache (the host's dpkg database and /var/lib/apt are never touched)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from installer.distros import payload
from installer.distros.family import PackageNotFound
from installer.errors import CommandFailed, HeadersFetchFailed
from installer.hostroot import HostRoot
from installer.runner import Result, Runner

if TYPE_CHECKING:
    from installer.config import Config
    from installer.distros.family import Facts

SOURCES_LIST = PurePosixPath("/etc/apt/sources.list")
SOURCES_PARTS = PurePosixPath("/etc/apt/sources.list.d")
TRUSTED = PurePosixPath("/etc/apt/trusted.gpg")
TRUSTED_PARTS = PurePosixPath("/etc/apt/trusted.gpg.d")
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}

_ONE_LINE = re.compile(r"^(deb|deb-src)\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(.+)$")
_DEPENDS = re.compile(r"^\s*\|?Depends:\s*<?([A-Za-z0-9.+-]+)>?", re.MULTILINE)
_HEADER_PACKAGE = re.compile(r"^linux-(?:[a-z0-9.+-]*-)?headers-|^linux-kbuild-")


def source_files(root: HostRoot) -> list[PurePosixPath]:
    """The host's apt source files, in apt's order."""
    found = [SOURCES_LIST] if root.local_resolved(SOURCES_LIST).is_file() else []
    return found + root.files_in(SOURCES_PARTS, (".list", ".sources"))


def _local_keys(root: HostRoot, value: str) -> str:
    """Keyring paths as this process reaches them (inside the root)."""
    return " ".join(str(root.local_resolved(v)) if v.startswith("/") else v
                    for v in value.replace(",", " ").split())


def rewrite_one_line(text: str, root: HostRoot, mirror: str | None) -> str:
    """A `.list` file for our private apt: binary entries only, keyrings re-rooted, and the URI
    replaced by the mirror when one is set."""
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        match = _ONE_LINE.match(line)
        if not match or match.group(1) != "deb" or match.group(3).startswith("cdrom:"):
            continue
        options = []
        for option in (match.group(2) or "").split():
            key, _, value = option.partition("=")
            if key.lower() == "signed-by":
                option = f"signed-by={_local_keys(root, value).replace(' ', ',')}"
            options.append(option)
        uri = mirror or match.group(3)
        opts = f"[{' '.join(options)}] " if options else ""
        out.append(f"deb {opts}{uri} {match.group(4)}")
    return "\n".join(out) + "\n"


def rewrite_deb822(text: str, root: HostRoot, mirror: str | None) -> str:
    """A `.sources` file for our private apt (same changes as `rewrite_one_line`)."""
    out = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        field = key.strip().lower() if sep and not line[:1].isspace() else ""
        if field == "types":
            kept = [t for t in value.split() if t == "deb"]
            out.append("Types: deb" if kept else "Types: deb\nEnabled: no")
        elif field == "uris" and mirror:
            out.append(f"URIs: {mirror}")
        elif field == "signed-by" and value.strip().startswith("/"):
            out.append(f"Signed-By: {_local_keys(root, value.strip())}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class PrivateApt:
    """apt-get/apt-cache options that read the host's sources and keys and keep all state in
    `work`."""

    work: Path
    options: tuple[str, ...]

    def argv(self, tool: str, *args: str) -> list[str]:
        opts = [f"-o{o}" for o in self.options]
        return [tool, *opts, *args]


def prepare(root: HostRoot, work: Path, arch: str, mirror: str | None) -> PrivateApt:
    """Write the rewritten sources and empty state under `work`; read only the host."""
    parts = work / "sources.list.d"
    for sub in ("state/lists/partial", "cache/archives/partial", "preferences.d"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    parts.mkdir(parents=True, exist_ok=True)
    (work / "status").write_text("")
    (work / "sources.list").write_text("")
    for index, path in enumerate(source_files(root)):
        text = root.local_resolved(path).read_text(errors="replace")
        if path.suffix == ".sources":
            (parts / f"{index:02d}-{path.stem}.sources").write_text(
                rewrite_deb822(text, root, mirror))
        else:
            (parts / f"{index:02d}-{path.stem}.list").write_text(
                rewrite_one_line(text, root, mirror))
    deb_arch = DEB_ARCH.get(arch, arch)
    options = (
        f"Dir::Etc::SourceList={work / 'sources.list'}",
        f"Dir::Etc::SourceParts={parts}",
        f"Dir::Etc::Trusted={root.local_resolved(TRUSTED)}",
        f"Dir::Etc::TrustedParts={root.local_resolved(TRUSTED_PARTS)}",
        f"Dir::Etc::Preferences={work / 'preferences'}",
        f"Dir::Etc::PreferencesParts={work / 'preferences.d'}",
        f"Dir::State={work / 'state'}",
        f"Dir::State::status={work / 'status'}",
        f"Dir::Cache={work / 'cache'}",
        f"APT::Architecture={deb_arch}",
        f"APT::Architectures={deb_arch}",
        # Our private dirs are root's; apt's _apt sandbox user could not write them.
        "APT::Sandbox::User=root",
        "Acquire::Languages=none",
        "Acquire::Retries=3",
    )
    return PrivateApt(work, options)


def update(runner: Runner, apt: PrivateApt) -> Result:
    """Fetch the indexes of every source (signatures checked by apt against the host's keys)."""
    return runner.run(apt.argv("apt-get", "update"), check=False, timeout=900,
                      env={"DEBIAN_FRONTEND": "noninteractive"})


def header_packages(runner: Runner, apt: PrivateApt, package: str) -> list[str] | None:
    """`package` and the header packages it depends on, transitively (Ubuntu's
    linux-<flavour>-headers-<base>, Debian's -common and linux-kbuild-<ver>); None when apt
    knows no such package."""
    wanted, seen = [package], []
    while wanted:
        name = wanted.pop(0)
        if name in seen:
            continue
        result = runner.run(apt.argv("apt-cache", "depends", "--no-recommends", "--no-suggests",
                                     "--no-conflicts", "--no-breaks", "--no-replaces",
                                     "--no-enhances", name), check=False, timeout=120)
        if not result.ok or not result.output.strip():
            if name == package:
                return None
            continue
        seen.append(name)
        wanted += [dep for dep in _DEPENDS.findall(result.output)
                   if _HEADER_PACKAGE.match(dep) and dep not in seen]
    return seen


def download(runner: Runner, apt: PrivateApt, packages: list[str], dest: Path) -> list[Path]:
    """`apt-get download` the packages into `dest` (hashes checked against the signed index)."""
    dest.mkdir(parents=True, exist_ok=True)
    runner.run(apt.argv("apt-get", "download", *packages), cwd=str(dest), timeout=1800,
               env={"DEBIAN_FRONTEND": "noninteractive"})
    return sorted(dest.glob("*.deb"))


def fetch(root: HostRoot, config: Config, facts: Facts, work: Path, runner: Runner,
          package: str, where: str) -> list[str]:
    """`package` and the header packages it depends on, fetched through the host's sources
    (or the mirror) and unpacked under `work/root`; returns their names. Raises
    KernelHeadersMissing (no source has it) or HeadersFetchFailed."""
    private = prepare(root, work / "apt", facts.arch, config.headers_mirror)
    updated = update(runner, private)
    packages = header_packages(runner, private, package)
    if packages is None:
        raise PackageNotFound(f"no source has it; tried {where}; apt-get update said:\n"
                              + updated.tail(15))
    try:
        debs = download(runner, private, packages, work / "debs")
    except CommandFailed as exc:
        raise HeadersFetchFailed(f"fetching {', '.join(packages)} from {where} failed: "
                                 f"{exc}") from exc
    payload.unpack(runner, debs, work / "root", f"{', '.join(packages)} from {where}")
    return packages
