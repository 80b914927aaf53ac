"""The SUSE family's header fetch: the image's zypper on a private root, cache and rpm database,
reading copies of the host's repo files and trusting the keys the host trusts (the host's own
zypper state is never touched)."""

from __future__ import annotations

import configparser
import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from installer.distros import payload, repofile
from installer.distros.family import PackageNotFound
from installer.errors import CommandFailed, HeadersFetchFailed
from installer.hostroot import HostRoot
from installer.runner import Result, Runner

if TYPE_CHECKING:
    from installer.config import Config
    from installer.distros.family import Facts

REPOS_DIR = PurePosixPath("/etc/zypp/repos.d")
# `?credentials=<name>` in a repo's URL names a file here (SUSEConnect's SCCcredentials, ...);
# $VARS in repo files are defined here. The private root links both, read-only, to the host's.
CREDENTIALS_DIR = PurePosixPath("/etc/zypp/credentials.d")
VARS_DIR = PurePosixPath("/etc/zypp/vars.d")
# suse-build-key (SLES) and openSUSE-build-key (Leap) install the distribution's signing keys
# here as armored files, and import them into the rpm database at install (kiwi's image
# scripts and zypper --root bootstraps import this same directory).
BUILD_KEYS = PurePosixPath("/usr/lib/rpm/gnupg/keys")
# libzypp reads the trusted keys of its root from the rpm database it finds there; created first
# so that it finds this one (whatever rpm's compiled-in %_dbpath is).
RPMDB = "/var/lib/rpm"
# The header packages a flavour's devel package needs: the noarch kernel-devel (or
# kernel-devel-rt, -azure: the variant's) with the sources' headers, and kernel-macros.
_NEEDED = re.compile(r"^(kernel-(?:devel|macros)[A-Za-z0-9_.+-]*)(?:\s*=\s*(\S+))?\s*$")
# What zypper prints for an argument no enabled, readable repository provides.
_NO_PACKAGE = "resolves to no package"
_TRUE = ("1", "yes", "on", "true")


def source_files(root: HostRoot) -> list[PurePosixPath]:
    """The host's .repo files, in the order zypper reads them."""
    return root.files_in(REPOS_DIR, (".repo",))


def rewrite_repos(text: str, mirror: str | None) -> str:
    """A host repo file for our private zypper: as it is, or with every baseurl replaced by
    `<mirror>/<repo alias>/` when a mirror is set. Raises configparser.Error for a file that is
    not one."""
    parser = repofile.parsed(text)
    if not mirror:
        return text
    repofile.point_at_mirror(parser, mirror)
    return repofile.written(parser)


def trusted_keys(root: HostRoot, repo_texts: list[str]) -> list[Path]:
    """The key files the host trusts for its repos (local paths): the distribution's build keys,
    then the `gpgkey=file://` keys of enabled repos that check signatures (zypper's default)."""
    keys: list[Path] = []
    build = root.local_resolved(BUILD_KEYS)
    if build.is_dir():
        keys += [p for p in sorted(build.iterdir()) if p.suffix == ".asc" and p.is_file()]
    for text in repo_texts:
        try:
            parser = repofile.parsed(text)
        except configparser.Error:
            continue  # no key is trusted for a file that is not a repo file
        for section in parser.sections():
            repo = parser[section]
            if repo.get("enabled", "1").strip().lower() not in _TRUE:
                continue
            if repo.get("gpgcheck", "1").strip().lower() not in _TRUE:
                continue
            for url in repo.get("gpgkey", "").split():
                if url.startswith("file:///"):
                    local = root.local_resolved(url[len("file://"):])
                    if local.is_file() and local not in keys:
                        keys.append(local)
    return keys


@dataclass(frozen=True)
class PrivateZypper:
    """zypper options that read the host's repos (copied), credentials and variables and keep
    every state of zypper's, its lock and log included, under `work`."""

    work: Path
    releasever: str
    keys: tuple[Path, ...]

    @property
    def sysroot(self) -> Path:
        return self.work / "sysroot"

    def argv(self, *args: str) -> list[str]:
        # Never --gpg-auto-import-keys nor --no-gpg-checks: non-interactive, zypper answers
        # "reject" to a key it does not trust and "no" to unsigned metadata (SUSE's zypper
        # manual), so such a repository is skipped.
        return ["zypper", "--non-interactive", "--root", str(self.sysroot),
                "--reposd-dir", str(self.work / "repos.d"),
                "--cache-dir", str(self.work / "cache"),
                "--pkg-cache-dir", str(self.work / "packages"),
                "--releasever", self.releasever, *args]

    def env(self) -> dict[str, str]:
        # ZYPP_CONF: libzypp's settings (the host's architecture); ZYPP_LOGFILE: zypper's log,
        # else /var/log/zypper.log of whatever filesystem it runs in.
        return {"ZYPP_CONF": str(self.work / "zypp.conf"),
                "ZYPP_LOGFILE": str(self.work / "zypper.log")}

    def import_argvs(self) -> list[list[str]]:
        """The host's trusted keys into the private rpm database, where libzypp looks."""
        return [["rpm", "--root", str(self.sysroot), "--dbpath", RPMDB, "--import", str(key)]
                for key in self.keys]

    def requires_argv(self, rpm: Path) -> list[str]:
        # zypper checked the package against the signed metadata; rpm only lists its needs.
        return ["rpm", "--dbpath", str(self.sysroot / RPMDB.lstrip("/")), "-qp",
                "--nosignature", "--nodigest", "--requires", str(rpm)]

    def downloaded(self) -> set[Path]:
        """The rpms in the package cache (zypper keeps one directory per repository)."""
        return set((self.work / "packages").rglob("*.rpm"))


def prepare(root: HostRoot, work: Path, version_id: str, arch: str,
            mirror: str | None) -> PrivateZypper:
    """Write the private root, repo copies and zypp.conf under `work`; read only the host."""
    repos = work / "repos.d"
    repos.mkdir(parents=True, exist_ok=True)
    (work / "sysroot" / RPMDB.lstrip("/")).mkdir(parents=True, exist_ok=True)
    zypp_dir = work / "sysroot/etc/zypp"
    zypp_dir.mkdir(parents=True, exist_ok=True)
    for host_dir in (CREDENTIALS_DIR, VARS_DIR):
        local = root.local_resolved(host_dir)
        link = zypp_dir / host_dir.name
        if local.is_dir() and not link.is_symlink():
            os.symlink(local, link)
    texts = []
    for path in source_files(root):
        text = root.local_resolved(path).read_text(errors="replace")
        with contextlib.suppress(configparser.Error):
            text = rewrite_repos(text, mirror)
        (repos / path.name).write_text(text)
        texts.append(text)
    (work / "zypp.conf").write_text("[main]\n" + (f"arch = {arch}\n" if arch else ""))
    return PrivateZypper(work, version_id, tuple(trusted_keys(root, texts)))


def download(runner: Runner, zypper: PrivateZypper, capability: str) -> tuple[Result, list[Path]]:
    """`zypper download` one package (by name-version or capability); the rpms it added."""
    before = zypper.downloaded()
    result = runner.run(zypper.argv("--no-refresh", "download", capability), check=False,
                        timeout=1800, env=zypper.env())
    return result, sorted(zypper.downloaded() - before)


def needed(requires: str) -> list[str]:
    """The header packages an rpm's requirements name, as zypper capabilities."""
    found = []
    for line in requires.splitlines():
        match = _NEEDED.match(line.strip())
        if match:
            name, evr = match.groups()
            found.append(f"{name} = {evr}" if evr else name)
    return found


def _not_fetched(capability: str, package: str, result: Result, refreshed: Result,
                 where: str) -> Exception:
    said = f"zypper said:\n{result.tail(15)}"
    if _NO_PACKAGE in result.output and refreshed.ok:
        if capability == package:
            return PackageNotFound(f"no source has it; tried {where}; {said}")
        return HeadersFetchFailed(
            f"{package} needs {capability}, which none of {where} has; {said}",
            hint="The host's repositories hold the kernel's devel package but not what it "
            "needs: enable the repository with it (SLES: the Basesystem module).")
    if _NO_PACKAGE in result.output:
        return HeadersFetchFailed(
            f"{capability} is in none of the repositories zypper could read, and it could not "
            f"read every one of {where}: zypper refuses a repository whose metadata is unsigned "
            "or signed by a key the host does not trust, and skips one it cannot reach. "
            f"zypper refresh said:\n{refreshed.tail(15)}",
            hint=f"Check that `zypper refresh` succeeds on the host with signature checks on "
            f"(keys: {BUILD_KEYS} and the repos' gpgkey= files), or set "
            "NVIDIA_INSTALLER_HEADERS_MIRROR; nothing was changed on the host.")
    return HeadersFetchFailed(
        f"zypper could not download {capability} from {where} (exit {result.returncode}); "
        f"{said}",
        hint="A package whose checksum does not match the signed metadata is discarded: check "
        "the route to the repository (a proxy rewriting it), then retry; nothing was changed "
        "on the host.")


def fetch(root: HostRoot, config: Config, facts: Facts, work: Path, runner: Runner,
          package: str, where: str) -> list[str]:
    """`package` and the header packages it needs, fetched through the host's repos (or the
    mirror) with signatures checked against the keys the host trusts, unpacked under
    `work/root`; returns what was fetched. Raises PackageNotFound (no repo has it) or
    HeadersFetchFailed."""
    private = prepare(root, work / "zypper", facts.distro.version_id, facts.arch,
                      config.headers_mirror)
    try:
        for argv in private.import_argvs():
            runner.run(argv, timeout=120)
    except CommandFailed as exc:
        raise HeadersFetchFailed(f"importing a key the host trusts failed: {exc}") from exc
    refreshed = runner.run(private.argv("refresh"), check=False, timeout=900,
                           env=private.env())
    wanted, fetched, rpms = [package], [], []
    while wanted:
        capability = wanted.pop(0)
        if capability in fetched:
            continue
        result, added = download(runner, private, capability)
        if not added:
            raise _not_fetched(capability, package, result, refreshed, where)
        fetched.append(capability)
        rpms += added
        for rpm in added:
            requires = runner.run(private.requires_argv(rpm), check=False, timeout=120)
            wanted += [c for c in needed(requires.output) if c not in fetched]
    payload.unpack(runner, rpms, work / "root", f"{', '.join(fetched)} from {where}")
    return fetched
