"""The RHEL family's header fetch: kernel-devel through the image's dnf reading the host's repos,
vars and keys with a private config, cache and rpm database (the host's are never touched)."""

from __future__ import annotations

import configparser
import contextlib
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
    from installer.distros.family import Facts, Release

REPOS_DIR = PurePosixPath("/etc/yum.repos.d")
VARS_DIRS = (PurePosixPath("/etc/dnf/vars"), PurePosixPath("/etc/yum/vars"))
_PATH_KEYS = ("gpgkey", "sslcacert", "sslclientcert", "sslclientkey")
_EL_MINOR = re.compile(r"\.el(\d+)_(\d+)")
VAULT_REPOS = ("BaseOS", "AppStream")


def source_files(root: HostRoot) -> list[PurePosixPath]:
    """The host's .repo files, in the order dnf reads them."""
    return root.files_in(REPOS_DIR, (".repo",))


def _reroot(root: HostRoot, value: str) -> str:
    """`file:///etc/pki/...` and `/etc/pki/...` as this process reaches them."""
    out = []
    for item in value.replace(",", " ").split():
        if item.startswith("file:///"):
            item = "file://" + str(root.local_resolved(item[len("file://"):]))
        elif item.startswith("/"):
            item = str(root.local_resolved(item))
        out.append(item)
    return " ".join(out)


def reroot_repos(parser: configparser.ConfigParser, root: HostRoot) -> None:
    """The key and certificate paths of every repo (`gpgkey=file:///etc/pki/...`,
    `sslcacert=/etc/pki/...`) as this process reaches them. dnf reads them from its own
    filesystem even under --installroot, so every dnf run on the host's repo files (the
    header fetch, the driver transaction) needs them re-rooted, here and only here."""
    for section in parser.sections():
        repo = parser[section]
        for key in _PATH_KEYS:
            if key in repo:
                repo[key] = _reroot(root, repo[key])


def rerooted_repo_file(text: str, root: HostRoot) -> str:
    """A host repo file with only its key and certificate paths re-rooted (reroot_repos).
    Raises configparser.Error for a file that is not one."""
    parser = repofile.parsed(text)
    reroot_repos(parser, root)
    return repofile.written(parser)


def write_rerooted_repos(root: HostRoot, dest: Path) -> Path:
    """Copies of the host's repo files in `dest` (emptied first), paths re-rooted: a reposdir
    for dnf --installroot. Reads the host only; a file that does not parse is copied as it
    is (dnf then names what is wrong with it). Returns `dest`."""
    if dest.is_dir():
        for old in dest.iterdir():
            old.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    for path in source_files(root):
        text = root.local_resolved(path).read_text(errors="replace")
        with contextlib.suppress(configparser.Error):
            text = rerooted_repo_file(text, root)
        (dest / path.name).write_text(text)
    return dest


def rewrite_repos(text: str, root: HostRoot, mirror: str | None) -> str:
    """A repo file for our private dnf: key and certificate paths re-rooted, unreachable repos
    skipped rather than fatal, and every baseurl replaced by `<mirror>/<repo id>/` when set."""
    parser = repofile.parsed(text)
    reroot_repos(parser, root)
    for section in parser.sections():
        parser[section]["skip_if_unavailable"] = "1"
    if mirror:
        repofile.point_at_mirror(parser, mirror)
    return repofile.written(parser)


def kernel_minor(kernel: str, distro: Release) -> str:
    """The minor release a RHEL-family kernel belongs to (`.el8_9` -> 8.9)."""
    match = _EL_MINOR.search(kernel)
    return f"{match.group(1)}.{match.group(2)}" if match else distro.version_id


def vault_repos(vault: str, minor: str, gpgkey: str) -> str:
    """Rocky's vault repos of one minor release (older minors' kernels live only there)."""
    lines = []
    for name in VAULT_REPOS:
        lines += [
            f"[headers-vault-{minor}-{name.lower()}]",
            f"name=Rocky Linux {minor} {name} (vault)",
            f"baseurl={vault.rstrip('/')}/{minor}/{name}/$basearch/os/",
            "enabled=1",
            f"gpgcheck={'1' if gpgkey else '0'}",
            *([f"gpgkey={gpgkey}"] if gpgkey else []),
            "skip_if_unavailable=1",
            "",
        ]
    return "\n".join(lines)


def enabled_keys(repo_texts: list[str]) -> list[str]:
    """Key files (`file://`, already re-rooted) of the enabled repos that check signatures."""
    keys: list[str] = []
    for text in repo_texts:
        parser = repofile.parsed(text)
        for section in parser.sections():
            repo = parser[section]
            if repo.get("enabled", "1").strip() not in ("1", "true", "yes", "True"):
                continue
            if repo.get("gpgcheck", "0").strip() not in ("1", "true", "yes", "True"):
                continue
            for key in repo.get("gpgkey", "").split():
                if key.startswith("file://") and key[7:] not in keys:
                    keys.append(key[7:])
    return keys


def releasever(root: HostRoot, distro: Release) -> str:
    """What dnf on the host substitutes for $releasever (a locked minor, else the major)."""
    for vars_dir in VARS_DIRS:
        text = root.read_text(vars_dir / "releasever")
        if text and text.strip():
            return text.strip()
    return str(distro.major)


@dataclass(frozen=True)
class PrivateDnf:
    work: Path
    config: Path
    releasever: str
    vars_dirs: tuple[str, ...]
    keys: tuple[str, ...]
    # The host's architecture: $basearch and the packages dnf offers are the host's, not this
    # process's (an x86 builder fetching an arm64 node's headers).
    arch: str = ""

    def argv(self, *args: str) -> list[str]:
        forced = [f"--forcearch={self.arch}"] if self.arch else []
        return ["dnf", f"--config={self.config}", f"--releasever={self.releasever}",
                f"--setopt=varsdir={','.join(self.vars_dirs)}", *forced, "-y", "-q", *args]

    def rpm_argv(self, *args: str) -> list[str]:
        return ["rpm", f"--dbpath={self.work / 'rpmdb'}", *args]


def prepare(root: HostRoot, work: Path, distro: Release, kernel: str, *, mirror: str | None,
            vault: str, arch: str = "") -> PrivateDnf:
    """Write the private dnf config and the re-rooted repo files under `work`; read only the
    host."""
    repos = work / "repos"
    repos.mkdir(parents=True, exist_ok=True)
    texts = []
    for path in source_files(root):
        text = rewrite_repos(root.local_resolved(path).read_text(errors="replace"), root, mirror)
        (repos / path.name).write_text(text)
        texts.append(text)
    if distro.id == "rocky" and vault and not mirror:
        major = distro.major
        key = f"/etc/pki/rpm-gpg/RPM-GPG-KEY-{'rockyofficial' if major == 8 else f'Rocky-{major}'}"
        local_key = root.local_resolved(key)
        text = vault_repos(vault, kernel_minor(kernel, distro),
                           f"file://{local_key}" if local_key.is_file() else "")
        (repos / "headers-vault.repo").write_text(text)
        texts.append(text)
    config = work / "dnf.conf"
    config.write_text("\n".join([
        "[main]",
        f"reposdir={repos}",
        f"cachedir={work / 'cache'}",
        f"persistdir={work / 'persist'}",
        f"logdir={work / 'log'}",
        "keepcache=0",
        "install_weak_deps=0",
        "",
    ]))
    vars_dirs = tuple(str(root.local_resolved(d)) for d in VARS_DIRS)
    return PrivateDnf(work, config, releasever(root, distro), vars_dirs,
                      tuple(enabled_keys(texts)), arch)


def download(runner: Runner, dnf: PrivateDnf, package: str, dest: Path) -> Result:
    dest.mkdir(parents=True, exist_ok=True)
    return runner.run(dnf.argv("download", f"--destdir={dest}", package), check=False,
                      timeout=1800)


def verify_argvs(dnf: PrivateDnf, rpms: list[Path]) -> list[list[str]]:
    """Import the repos' keys into a private rpm database, then check each package's
    signature and digests against them (dnf download alone checks none)."""
    argvs = [dnf.rpm_argv("--import", key) for key in dnf.keys]
    return [*argvs, dnf.rpm_argv("--checksig", *map(str, rpms))]


def fetch(root: HostRoot, config: Config, facts: Facts, work: Path, runner: Runner,
          package: str, where: str) -> list[str]:
    """`package` fetched through the host's repos (or the mirror, or Rocky's vault), its signature
    checked against the keys those repos trust, unpacked under `work/root`. Raises
    KernelHeadersMissing (no repo has it) or HeadersFetchFailed."""
    private = prepare(root, work / "dnf", facts.distro, facts.kernel_release,
                          mirror=config.headers_mirror, vault=config.rocky_vault,
                          arch=facts.arch)
    rpms_dir = work / "rpms"
    result = download(runner, private, package, rpms_dir)
    rpms = sorted(rpms_dir.glob("*.rpm"))
    if not rpms:
        raise PackageNotFound(f"no source has it; tried {where}; dnf said:\n" + result.tail(15))
    try:
        if private.keys:
            checked = [runner.run(argv, timeout=300) for argv in verify_argvs(private, rpms)]
            unsigned = [line for line in checked[-1].output.splitlines()
                        if line.strip() and "signatures OK" not in line]
            if unsigned:
                raise HeadersFetchFailed(
                    f"{package} from {where} is not signed by a key the host's "
                    "repos trust:\n" + "\n".join(unsigned))
    except CommandFailed as exc:
        raise HeadersFetchFailed(f"checking {package} from {where} failed: {exc}") from exc
    payload.unpack(runner, rpms, work / "root", f"{package} from {where}")
    return [package]
