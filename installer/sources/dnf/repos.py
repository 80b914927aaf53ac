"""The host's dnf repo files: every repo section, NVIDIA's repo found by its file or URL, the
repos tried (credentials redacted), a fetched .repo file checked before it is written."""

# What a .repo must say before it is written to the host (check_repo_file), and why: dnf
# installs whatever a repo serves as root, so the packages' signatures are what vouches for
# them, not the server. Exactly one enabled section (a second one could add or shadow any
# repo); gpgcheck=1 with the key(s) named over https:// or file:// (a key fetched over http
# is whatever the network says it is); baseurl/metalink/mirrorlist over https:// (file://
# only in a .repo the operator gave as a file:// URL). The host's own repo files are never
# rewritten: an existing NVIDIA repo that lets unsigned packages in is refused, not edited.
# Every file is read as dnf reads it: option names case-sensitively (to dnf `GPGCHECK=1` is no
# gpgcheck at all, and the repo falls back to [main]'s, off unless set) and [DEFAULT] as one
# more section, not defaults for the others.

from __future__ import annotations

import configparser
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from installer.errors import HostRepoInsecure, RepoFileRefused
from installer.hostroot import HostRoot

REPOS_DIR = PurePosixPath("/etc/yum.repos.d")
DNF_CONF = PurePosixPath("/etc/dnf/dnf.conf")
_NVIDIA_BASEURL = "/compute/cuda/repos/"


class _AsDnfReads(configparser.ConfigParser):
    """configparser lowercases option names and folds [DEFAULT] into every section; dnf does
    neither, and a check that reads a file differently from dnf checks another file."""

    def __init__(self, *, strict: bool) -> None:
        super().__init__(interpolation=None, strict=strict, default_section="\0")

    def optionxform(self, optionstr: str) -> str:
        return optionstr


@dataclass(frozen=True)
class RepoEntry:
    file: str
    repo_id: str
    url: str
    enabled: bool
    gpgcheck: bool = False  # as dnf reads it: the section's, else dnf.conf's [main]


def repo_entries(root: HostRoot) -> list[RepoEntry]:
    """Every repo section in the host's /etc/yum.repos.d (unreadable files are skipped)."""
    directory = root.local(REPOS_DIR)
    entries: list[RepoEntry] = []
    default_gpgcheck = _main_gpgcheck(root)
    try:
        files = sorted(p for p in directory.iterdir() if p.name.endswith(".repo"))
    except OSError:
        return entries
    for path in files:
        parser = _AsDnfReads(strict=False)
        try:
            parser.read_string(path.read_text(errors="replace"))
        except (OSError, configparser.Error):
            continue
        for section in parser.sections():
            values = parser[section]
            url = values.get("baseurl") or values.get("metalink") or values.get("mirrorlist") or ""
            enabled = values.get("enabled", "1").strip().lower() not in _FALSE
            gpgcheck = _true(values["gpgcheck"]) if "gpgcheck" in values else default_gpgcheck
            entries.append(RepoEntry(path.name, section, url.split()[0] if url else "", enabled,
                                     gpgcheck))
    return entries


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _true(value: str) -> bool:
    return value.strip().lower() in _TRUE


def _main_gpgcheck(root: HostRoot) -> bool:
    parser = _AsDnfReads(strict=False)
    try:
        parser.read_string(root.local(DNF_CONF).read_text(errors="replace"))
        return _true(parser.get("main", "gpgcheck", fallback="0"))
    except (OSError, configparser.Error):
        return False  # dnf's own default


def nvidia_repo(root: HostRoot) -> RepoEntry | None:
    """An enabled repo that looks like NVIDIA's CUDA repo (its file or its URL)."""
    for entry in repo_entries(root):
        if entry.enabled and _looks_nvidia(entry):
            return entry
    return None


def _looks_nvidia(entry: RepoEntry) -> bool:
    return entry.file.startswith(("cuda-rhel", "cuda-amzn")) or _NVIDIA_BASEURL in entry.url


def unsigned_host_repo(root: HostRoot, file: str | None = None) -> RepoEntry | None:
    """The first enabled section of the host's NVIDIA repo files (or of `file`) that dnf reads
    without gpgcheck, or None. Reads files only."""
    for entry in repo_entries(root):
        chosen = entry.file == file if file is not None else _looks_nvidia(entry)
        if chosen and entry.enabled and not entry.gpgcheck:
            return entry
    return None


def refuse_unsigned_host_repo(entry: RepoEntry) -> HostRepoInsecure:
    return HostRepoInsecure(
        f"the host's {REPOS_DIR}/{entry.file} enables [{entry.repo_id}] without gpgcheck=1 "
        "(neither the section nor /etc/dnf/dnf.conf sets it): dnf would install its packages "
        "unsigned, so the installer will not use it")


def repos_tried(root: HostRoot) -> str:
    enabled = [e for e in repo_entries(root) if e.enabled]
    if not enabled:
        return f"no enabled repos in {REPOS_DIR}"
    return ", ".join(f"{e.repo_id} ({_redact(e.url) or e.file})" for e in enabled)


def _redact(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)


def repo_file_name(url: str, fallback: str) -> str:
    """The .repo file's name from its URL, else `fallback` (the name of NVIDIA's own)."""
    name = url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    if re.fullmatch(r"[A-Za-z0-9._-]+\.repo", name):
        return name
    return fallback


def check_repo_file(text: str, shown: str, *, local: bool,
                    host_ids: dict[str, str] | None = None) -> str:
    """The one repo id of a fetched .repo file, checked as the module's header says. `shown`:
    where it came from (redacted); `local`: it was given as a file:// URL, so file:// URLs in
    it are the operator's; `host_ids`: the repo ids the host already has, and their files (a
    fetched repo may not take one over). Raises RepoFileRefused naming the section, the line
    and why."""
    parser = _AsDnfReads(strict=True)
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        message = str(exc).splitlines()[0]
        raise RepoFileRefused(f"{shown} is not a dnf .repo file: {message}") from None
    sections = parser.sections()
    if not sections:
        raise RepoFileRefused(f"{shown} is not a dnf .repo file: it has no [repo] section")
    if len(sections) > 1:
        raise RepoFileRefused(
            f"{shown} defines {len(sections)} repos ({', '.join(f'[{s}]' for s in sections)}); "
            "only NVIDIA's one repo section is accepted: another could add or replace any repo "
            "the host installs from")
    repo_id = sections[0]
    values = parser[repo_id]

    def refuse(why: str) -> RepoFileRefused:
        return RepoFileRefused(f"{shown}: [{repo_id}] {why}")

    if repo_id.lower() in ("main", "default"):
        # [main] is dnf's own settings section, not a repo (dnf.conf's gpgcheck default lives
        # there), and [DEFAULT] is defaults to any tool that reads the file with Python's
        # configparser: either way the section checked is not the repo dnf would use.
        raise refuse("is not a repo id: [main] holds dnf's own settings and [DEFAULT] other "
                     "readers' defaults; the section must name NVIDIA's repo")
    for option in values:
        if option != option.lower():
            raise refuse(f"has option {option}=: dnf reads option names as written and ignores "
                         f"this one (not {option.lower()}=), so the check and dnf would disagree; "
                         "option names must be lowercase")
    if "enabled" in values and not _true(values["enabled"]):
        raise refuse(f"has enabled={values['enabled']}: the repo would not be used")
    if not _true(values.get("gpgcheck", "")):
        said = f"gpgcheck={values['gpgcheck']}" if "gpgcheck" in values else "no gpgcheck="
        raise refuse(f"has {said}: dnf would install its packages without checking NVIDIA's "
                     "signature; gpgcheck=1 is required")
    for option in ("repo_gpgcheck", "pkg_gpgcheck", "sslverify"):
        if option in values and not _true(values[option]):
            raise refuse(f"has {option}={values[option]}: a check dnf does would be switched off")
    keys = _urls(values.get("gpgkey", ""))
    if not keys:
        raise refuse("names no signing key (gpgkey=): gpgcheck=1 needs NVIDIA's key named")
    for key in keys:
        if not key.startswith(("https://", "file://")):
            raise refuse(f"has gpgkey={_redact(key)}: keys must come over https:// or from a "
                         "file:// path (a key over plain http is whatever the network says)")
    sources = [(option, url) for option in ("baseurl", "metalink", "mirrorlist")
               for url in _urls(values.get(option, ""))]
    if not sources:
        raise refuse("has no baseurl, metalink or mirrorlist")
    schemes = ("https://", "file://") if local else ("https://",)
    for option, url in sources:
        if not url.startswith(schemes):
            allowed = "https:// (or file:// in a .repo given as a file:// URL)"
            raise refuse(f"has {option}={_redact(url)}: the repo must be reached over {allowed}")
    owner = (host_ids or {}).get(repo_id)
    if owner is not None:
        raise refuse(f"has the id of the host's own repo in {REPOS_DIR}/{owner}: the host's "
                     "repo files are not shadowed or replaced")
    return repo_id


def _urls(value: str) -> list[str]:
    return [u for u in re.split(r"[\s,]+", value.strip()) if u]
