"""The private apt (distros/apt.py) reading the host's package sources: a release's own
sources files (tests/lib/hosts) read whole, keyrings rerooted under the host's root."""

from __future__ import annotations

from pathlib import Path

from lib import hostreleases

from installer.distros import apt
from installer.hostroot import HostRoot


def test_trixies_debian_sources_is_read_with_both_stanzas(tmp_path: Path) -> None:
    trixie = hostreleases.release("debian-13")
    sources = trixie.files["etc/apt/sources.list.d/debian.sources"]
    parts = tmp_path / "etc/apt/sources.list.d"
    parts.mkdir(parents=True)
    (parts / "debian.sources").write_text(sources)
    root = HostRoot(tmp_path)
    # Trixie has no /etc/apt/sources.list at all.
    assert apt.source_files(root) == [apt.SOURCES_PARTS / "debian.sources"]
    keyring = f"{tmp_path}/usr/share/keyrings/debian-archive-keyring.gpg"
    assert apt.rewrite_deb822(sources, root, None) == sources.replace(
        "/usr/share/keyrings/debian-archive-keyring.gpg", keyring)
    work = tmp_path / "work"
    apt.prepare(root, work, "x86_64", None)
    written = (work / "sources.list.d/00-debian.sources").read_text()
    assert written.count("Types: deb\n") == 2 and "Suites: trixie-security" in written
    assert written.count(f"Signed-By: {keyring}") == 2
