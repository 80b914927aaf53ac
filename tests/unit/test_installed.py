"""The markers that let a later run reuse a .run's extracted tree or a Fabric Manager install
name what vouched for the file they came from. An older installer's marker (the version alone)
was written for files it took on a mirror's own checksum: it is not trusted."""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

from installer.components import fm_archive
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.sources.installed import EXTRACTED_MARKER, extracted_marker, is_extracted

V = "580.105.08"
DIGEST = hashlib.sha256(b"the .run").hexdigest()


def _tree(directory: Path, marker: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "nvidia-installer").write_text("#!/bin/sh\n")
    (directory / f"libnvidia-ml.so.{V}").write_bytes(b"")
    (directory / EXTRACTED_MARKER).write_text(marker)
    return directory


def test_an_older_installers_extracted_tree_is_not_trusted(tmp_path: Path) -> None:
    assert not is_extracted(_tree(tmp_path / "old", f"{V}\n"), V)


def test_a_tree_marked_with_the_runs_digest_is_reused(tmp_path: Path) -> None:
    assert extracted_marker(V, DIGEST) == f"{V}\n{DIGEST}\n"
    assert is_extracted(_tree(tmp_path / "new", f"{V}\n{DIGEST}\n"), V)


def test_a_marker_of_another_form_is_not_trusted(tmp_path: Path) -> None:
    for i, marker in enumerate([f"{V}\n\n", f"{V}\n{DIGEST[:-1]}\n", f"{V}\n{DIGEST.upper()}\n",
                                f"{V}\n{DIGEST}\nmore\n", f"580.126.20\n{DIGEST}\n",
                                f"{V}\n{'g' * 64}\n", f"{V}\n{DIGEST}"]):
        assert not is_extracted(_tree(tmp_path / str(i), marker), V), marker


def _layout(install: Path) -> Layout:
    return Layout(HostRoot(Path("/")), PurePosixPath(str(install)), install,
                  PurePosixPath(str(install / "cache")))


def _fabricmanager(layout: Layout, marker: str) -> None:
    fm_archive.binary(layout, V).parent.mkdir(parents=True)
    fm_archive.binary(layout, V).write_text("#!/bin/sh\n")
    config = fm_archive.config_dir(layout, V)
    config.mkdir(parents=True)
    (config / fm_archive.INSTALLED_MARKER).write_text(marker)


def test_an_older_installers_fabric_manager_is_not_trusted(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    _fabricmanager(layout, f"{V}\n")
    assert not fm_archive.installed(layout, V)


def test_a_fabric_manager_marked_with_the_archives_digest_is_trusted(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    _fabricmanager(layout, f"{V}\n{DIGEST}\n")
    assert fm_archive.installed(layout, V)


def test_install_marks_the_archives_digest(tmp_path: Path) -> None:
    archive_bytes = b"an archive"
    archive = tmp_path / "fm.tar.xz"
    archive.write_bytes(archive_bytes)
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "nv-fabricmanager").write_text("#!/bin/sh\n")
    (tree / "etc").mkdir()
    (tree / "etc" / "fabricmanager.cfg").write_text("DAEMONIZE=1\n")
    fm_archive.record_archive_digest(archive, tree)
    layout = _layout(tmp_path / "install")
    fm_archive.install(tree, layout.version_dir(V), fm_archive.config_dir(layout, V), V)
    marker = fm_archive.config_dir(layout, V) / fm_archive.INSTALLED_MARKER
    assert marker.read_text() == f"{V}\n{hashlib.sha256(archive_bytes).hexdigest()}\n"
    assert fm_archive.installed(layout, V)
