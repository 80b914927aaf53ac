"""The host's dnf repo files: every repo section, NVIDIA's repo found by its file or URL, the
repos tried (credentials redacted), a fetched .repo file checked before it is written."""

from __future__ import annotations

import configparser
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from installer.hostroot import HostRoot

REPOS_DIR = PurePosixPath("/etc/yum.repos.d")
NVIDIA_REPO_URL = (
    "https://developer.download.nvidia.com/compute/cuda/repos/rhel{major}/{arch}/"
    "cuda-rhel{major}.repo"
)
_NVIDIA_BASEURL = "/compute/cuda/repos/"


@dataclass(frozen=True)
class RepoEntry:
    file: str
    repo_id: str
    url: str
    enabled: bool


def repo_entries(root: HostRoot) -> list[RepoEntry]:
    """Every repo section in the host's /etc/yum.repos.d (unreadable files are skipped)."""
    directory = root.local(REPOS_DIR)
    entries: list[RepoEntry] = []
    try:
        files = sorted(p for p in directory.iterdir() if p.name.endswith(".repo"))
    except OSError:
        return entries
    for path in files:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read_string(path.read_text(errors="replace"))
        except (OSError, configparser.Error):
            continue
        for section in parser.sections():
            values = parser[section]
            url = values.get("baseurl") or values.get("metalink") or values.get("mirrorlist") or ""
            enabled = values.get("enabled", "1").strip().lower() not in ("0", "false", "no")
            entries.append(RepoEntry(path.name, section, url.split()[0] if url else "", enabled))
    return entries


def nvidia_repo(root: HostRoot) -> RepoEntry | None:
    """An enabled repo that looks like NVIDIA's CUDA repo (its file or its URL)."""
    for entry in repo_entries(root):
        if entry.enabled and (entry.file.startswith("cuda-rhel") or _NVIDIA_BASEURL in entry.url):
            return entry
    return None


def repos_tried(root: HostRoot) -> str:
    enabled = [e for e in repo_entries(root) if e.enabled]
    if not enabled:
        return f"no enabled repos in {REPOS_DIR}"
    return ", ".join(f"{e.repo_id} ({_redact(e.url) or e.file})" for e in enabled)


def _redact(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)


def repo_file_name(url: str, major: int) -> str:
    name = url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    if re.fullmatch(r"[A-Za-z0-9._-]+\.repo", name):
        return name
    return f"cuda-rhel{major}.repo"


def check_repo_file(text: str) -> list[str]:
    """The repo ids a fetched .repo file defines; raises ValueError when it is not one."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        raise ValueError(f"not a dnf .repo file ({exc.__class__.__name__})") from None
    ids = [
        s
        for s in parser.sections()
        if any(parser[s].get(k) for k in ("baseurl", "metalink", "mirrorlist"))
    ]
    if not ids:
        raise ValueError("no [repo] section with a baseurl, metalink or mirrorlist")
    return ids
