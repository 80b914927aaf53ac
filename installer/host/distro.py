"""The host's distribution from its os-release, checked against the families the installer
supports (installer.distros)."""

from __future__ import annotations

import shlex
from typing import NamedTuple

from installer import distros
from installer.errors import UnsupportedDistro
from installer.hostroot import HostRoot

OS_RELEASE_PATHS = ("/etc/os-release", "/usr/lib/os-release")


class Distro(NamedTuple):
    """The host's distribution as os-release names it."""

    id: str
    version_id: str
    major: int
    family: str  # a family's name in installer.distros
    pretty_name: str
    codename: str = ""
    source: str = ""

    def __str__(self) -> str:
        return self.pretty_name or f"{self.id} {self.version_id}"


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=value lines with shell quoting, as os-release(5) defines them."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        try:
            parts = shlex.split(value)
        except ValueError:
            parts = [value.strip("\"'")]
        values[key.strip()] = " ".join(parts)
    return values


def detect_distro(root: HostRoot) -> Distro:
    """Read the host's os-release (reads /etc/os-release, then /usr/lib/os-release).

    Raises UnsupportedDistro when neither exists or the distro/version is not supported.
    """
    for host_path in OS_RELEASE_PATHS:
        text = root.read_text(host_path)
        if text is not None:
            return distro_from_os_release(text, str(root.local(host_path)))
    raise UnsupportedDistro(
        f"no os-release found under the host root {root.root} (looked for "
        f"{', '.join(str(root.local(p)) for p in OS_RELEASE_PATHS)}); the root may be wrong"
    )


def distro_from_os_release(text: str, source: str) -> Distro:
    """A supported Distro from os-release content; `source` names the file in errors."""
    values = parse_os_release(text)
    distro_id = values.get("ID", "").lower()
    version_id = values.get("VERSION_ID", "")
    found = f"ID={distro_id or '?'} VERSION_ID={version_id or '?'} (read from {source})"
    family = distros.supporting(distro_id, version_id, found)
    return Distro(
        id=distro_id,
        version_id=version_id,
        major=int(version_id.split(".", 1)[0]),
        family=family.name,
        pretty_name=values.get("PRETTY_NAME", f"{distro_id} {version_id}"),
        codename=values.get("VERSION_CODENAME", ""),
        source=source,
    )
