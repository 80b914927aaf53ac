"""Links planted where other pods can write (the install dir and its cache, the readiness dir,
the host's module and firmware trees): every kind of path the installer writes there refuses
them with planted-link, and nothing outside is touched."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from lib.contexts import V, context
from lib.fakes import FakeRunner
from lib.httpfaults import serve_directory

from installer import dirs, safefs, state, steps
from installer.delivery import DownloadSettings, fetch_file
from installer.errors import ChecksumMismatch, InstallerError, PlantedLink
from installer.hostroot import HostRoot
from installer.layout import READY_FILE
from installer.outcome import OUTCOME_FILE

NAME = "NVIDIA-Linux-x86_64-580.95.05.run"
QUIET = DownloadSettings(retries=0, progress="none")
PRECIOUS = b"root:precious:19000::::::\n"


def victim(tmp_path: Path, name: str = "shadow") -> Path:
    """A host file outside every directory the installer owns."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    path = outside / name
    path.write_bytes(PRECIOUS)
    path.chmod(0o644)
    return path


def planted_link(link: Path, target: Path) -> Path:
    """`link` made a symlink to the directory `target` outside (both made, with their
    parents); returns the target."""
    target.mkdir(parents=True, exist_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return target


def untouched(path: Path) -> None:
    assert path.read_bytes() == PRECIOUS
    assert path.stat().st_mode & 0o777 == 0o644


def refused(info: pytest.ExceptionInfo[InstallerError], path: Path) -> None:
    assert info.value.reference == "planted-link"
    assert info.value.exit_code == 112
    assert str(path) in info.value.message
    assert "remove the link" in info.value.hint


# ----------------------------------------------------------------------------- the lock


def test_a_link_at_the_lock_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    install = tmp_path / "install"
    install.mkdir()
    target = victim(tmp_path)
    (install / ".installer.lock").symlink_to(target)
    with pytest.raises(InstallerError) as info, \
            state.HostLock(install / ".installer.lock", timeout=1):
        pass
    refused(info, install / ".installer.lock")
    untouched(target)
    assert (install / ".installer.lock").is_symlink()


def test_a_hard_link_at_the_lock_is_refused(tmp_path: Path) -> None:
    install = tmp_path / "install"
    install.mkdir()
    target = victim(tmp_path)
    os.link(target, install / ".installer.lock")
    with pytest.raises(PlantedLink, match="hard link"), \
            state.HostLock(install / ".installer.lock", timeout=1):
        pass
    untouched(target)


def test_the_lock_still_works_on_its_own_file(tmp_path: Path) -> None:
    lock = tmp_path / "install" / ".installer.lock"
    with state.HostLock(lock, timeout=1):
        assert lock.read_text() == f"{os.getpid()}\n"
    with state.HostLock(lock, timeout=1):
        assert lock.read_text() == f"{os.getpid()}\n"


# ----------------------------------------------------------------------------- part files


def test_a_link_at_a_part_file_with_an_http_mirror_writes_nothing_outside(
    tmp_path: Path,
) -> None:
    www = tmp_path / "www"
    www.mkdir()
    (www / NAME).write_bytes(b"what the mirror serves")
    downloads = tmp_path / "install/cache/downloads"
    downloads.mkdir(parents=True)
    target = victim(tmp_path)
    (downloads / (NAME + ".part")).symlink_to(target)
    with serve_directory(www) as (base, requests), pytest.raises(InstallerError) as info:
        fetch_file([f"{base}/{NAME}"], downloads, NAME,
                   sha256=hashlib.sha256(b"the real runfile").hexdigest(), settings=QUIET)
    refused(info, downloads / (NAME + ".part"))
    untouched(target)
    assert requests == []  # refused before a byte was asked for
    assert not (downloads / NAME).exists()


def test_a_link_above_the_downloads_dir_is_refused(tmp_path: Path) -> None:
    install = tmp_path / "install"
    elsewhere = planted_link(install / "cache/downloads", tmp_path / "outside/etc")
    with pytest.raises(PlantedLink) as info:
        fetch_file(["file:///nonexistent/x.run"], install / "cache/downloads", NAME,
                   sha256="0" * 64, settings=QUIET, within=install)
    assert str(install / "cache/downloads") in info.value.message
    assert list(elsewhere.iterdir()) == []


class _Mover(BaseHTTPRequestHandler):
    """Sends half the body, then (as a pod with the cache mounted would) renames the part file
    away, then sends the rest: the bytes written after that land in the renamed file."""

    part: Path
    stolen: Path
    body = b"x" * 4096

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        half = len(self.body) // 2
        self.wfile.write(self.body[:half])
        self.wfile.flush()
        deadline = time.monotonic() + 5
        while not self.part.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.rename(self.part, self.stolen)
        self.wfile.write(self.body[half:])

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def mover(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    downloads = tmp_path / "install/cache/downloads"
    downloads.mkdir(parents=True)
    handler = type("Handler", (_Mover,), {"part": downloads / (NAME + ".part"),
                                          "stolen": downloads / "stolen"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{NAME}", downloads, \
            downloads / "stolen"
    finally:
        server.shutdown()
        server.server_close()


def test_a_checksum_mismatch_removes_the_bytes_wherever_they_went(
    mover: tuple[str, Path, Path],
) -> None:
    url, downloads, stolen = mover
    with pytest.raises(ChecksumMismatch):
        fetch_file([url], downloads, NAME, sha256="0" * 64, settings=QUIET)
    assert stolen.exists() and stolen.stat().st_size == 0
    assert not (downloads / NAME).exists()


# ----------------------------------------------------------------------------- records


@pytest.mark.parametrize("name", ["state.json", OUTCOME_FILE, ".cache"])
def test_a_link_at_a_record_is_refused_and_its_target_kept(tmp_path: Path, name: str) -> None:
    install = tmp_path / "install"
    install.mkdir()
    target = victim(tmp_path)
    (install / name).symlink_to(target)
    record = state.InstallRecord("580.95.05", "open", "6.8.0", "runfile", "/x")
    with pytest.raises(InstallerError) as info:
        state.write_record(install / name, record)
    refused(info, install / name)
    untouched(target)
    assert (install / name).is_symlink()
    assert state.read_record(install / name) is None  # never read through the link either


# ----------------------------------------------------------------------------- readiness files


@pytest.mark.parametrize("name", [READY_FILE.name, "fabricmanager-ready", "daemons-paused"])
def test_a_link_at_a_readiness_file_is_refused_and_its_target_kept(
    tmp_path: Path, name: str,
) -> None:
    root = HostRoot(tmp_path / "root")
    shadow = root.local("/etc/shadow")
    shadow.parent.mkdir(parents=True)
    shadow.write_bytes(PRECIOUS)
    shadow.chmod(0o644)
    ready_dir = root.local(READY_FILE.parent)
    ready_dir.mkdir(parents=True)
    (ready_dir / name).symlink_to("/etc/shadow")  # absolute: the host's /etc/shadow
    with pytest.raises(InstallerError) as info:
        root.write_atomic(READY_FILE.parent / name, "DRIVER_VERSION=580.95.05\n")
    refused(info, ready_dir / name)
    untouched(shadow)
    assert (ready_dir / name).is_symlink()


# ----------------------------------------------------------------------------- markers


def test_a_link_at_a_completion_marker_neither_counts_nor_is_written(tmp_path: Path) -> None:
    tree = tmp_path / "install/cache/extracted/580.95.05"
    tree.mkdir(parents=True)
    target = victim(tmp_path)
    (tree / dirs.COMPLETE_MARKER).symlink_to(target)
    assert not dirs.is_complete(tree)
    with pytest.raises(PlantedLink):
        dirs.mark_complete(tree, "580.95.05\n")
    untouched(target)


# ----------------------------------------------------------------------------- scratch dirs


def test_a_cache_link_never_empties_another_tmp(tmp_path: Path) -> None:
    install = tmp_path / "install"
    install.mkdir()
    elsewhere = tmp_path / "outside/var"
    (elsewhere / "tmp").mkdir(parents=True)
    (elsewhere / "tmp/keep").write_bytes(PRECIOUS)
    (install / "cache").symlink_to(elsewhere)
    with pytest.raises(PlantedLink) as info, dirs.scratch(install / "cache/tmp", within=install):
        raise AssertionError("the scratch dir was handed out")
    assert str(install / "cache") in info.value.message
    assert (elsewhere / "tmp/keep").read_bytes() == PRECIOUS


def test_the_runfile_steps_scratch_refuses_a_cache_link_before_any_tool_runs(
    tmp_path: Path,
) -> None:
    from installer.sources.runfile.steps import place_userspace

    runner = FakeRunner()
    ctx = context(tmp_path, runner)
    install = ctx.layout.install_local
    assert ctx.layout.cache_anchor == install
    elsewhere = tmp_path / "outside/var"
    (elsewhere / "tmp").mkdir(parents=True)
    (elsewhere / "tmp/keep").write_bytes(PRECIOUS)
    install.mkdir(parents=True, exist_ok=True)
    safefs.remove_tree(install / "cache", anchor=install)
    (install / "cache").symlink_to(elsewhere)
    with pytest.raises(PlantedLink):
        place_userspace(ctx, tmp_path / "staging")
    assert runner.calls == []
    assert (elsewhere / "tmp/keep").read_bytes() == PRECIOUS


def test_a_link_at_nvidia_installers_log_is_refused_before_it_runs(tmp_path: Path) -> None:
    from installer.sources.runfile.steps import place_userspace

    runner = FakeRunner()
    ctx = context(tmp_path, runner)
    target = victim(tmp_path)
    ctx.layout.install_local.mkdir(parents=True, exist_ok=True)
    ctx.layout.installer_log.symlink_to(target)
    with pytest.raises(PlantedLink):
        place_userspace(ctx, tmp_path / "staging")
    assert runner.calls == []
    untouched(target)


def test_a_cache_elsewhere_is_its_own_anchor(tmp_path: Path) -> None:
    ctx = context(tmp_path, FakeRunner(), NVIDIA_INSTALLER_CACHE_DIR="/var/cache/nvidia")
    assert ctx.layout.cache_anchor == ctx.layout.cache_local
    assert ctx.layout.anchor_for(ctx.layout.tmp) == ctx.layout.cache_local
    assert ctx.layout.anchor_for(ctx.layout.version_dir(V)) == ctx.layout.install_local


def test_a_link_inside_a_scratch_dir_is_removed_not_followed(tmp_path: Path) -> None:
    install = tmp_path / "install"
    elsewhere = planted_link(install / "cache/tmp/inner", tmp_path / "outside")
    (elsewhere / "keep").write_bytes(PRECIOUS)
    with dirs.scratch(install / "cache/tmp", within=install) as tmp:
        assert list(tmp.iterdir()) == []
    assert (elsewhere / "keep").read_bytes() == PRECIOUS
    assert not (install / "cache/tmp").exists()


# ----------------------------------------------------------------------------- extracted trees


def test_an_extracted_tree_is_never_staged_through_a_link(tmp_path: Path) -> None:
    install = tmp_path / "install"
    (install / "cache").mkdir(parents=True)
    elsewhere = tmp_path / "outside/usr"
    (elsewhere / "580.95.05").mkdir(parents=True)
    (elsewhere / "580.95.05/keep").write_bytes(PRECIOUS)
    (install / "cache/extracted").symlink_to(elsewhere)
    with pytest.raises(PlantedLink), \
            dirs.staged_dir(install / "cache/extracted/580.95.05", within=install) as staging:
        (staging / "nvidia-smi").write_bytes(b"payload")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["580.95.05"]
    assert (elsewhere / "580.95.05/keep").read_bytes() == PRECIOUS


@pytest.mark.parametrize("planted", ["versions", "versions/580.95.05/bin",
                                     "versions/580.95.05/bin/nv-fabricmanager"])
def test_fabric_manager_is_never_placed_through_a_link(tmp_path: Path, planted: str) -> None:
    from installer.components import fm_archive

    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin/nv-fabricmanager").write_text("#!/bin/sh\n")
    (tree / "etc").mkdir()
    (tree / "etc/fabricmanager.cfg").write_text("DAEMONIZE=1\n")
    install = tmp_path / "install"
    final = install / "versions/580.95.05"
    final.mkdir(parents=True)
    target = victim(tmp_path, "nv-fabricmanager")
    link = install / planted
    if link.exists():
        safefs.remove_tree(link, anchor=install)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target if planted.endswith("nv-fabricmanager") else target.parent)
    try:
        fm_archive.install(tree, final, final / "share/nvidia/nvswitch", "580.95.05",
                           within=install)
    except PlantedLink:
        pass
    else:  # a link at the file's own name is replaced by the new file, never written through
        assert planted.endswith("nv-fabricmanager")
        assert not link.is_symlink() and link.read_text() == "#!/bin/sh\n"
    untouched(target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["nv-fabricmanager"]


# ----------------------------------------------------------------------- module/firmware trees


K = "5.15.0-105-generic"


def _built(ctx: Any) -> None:
    build = ctx.layout.module_build(V, K, "open")
    build.mkdir(parents=True)
    (build / "nvidia.ko").write_bytes(b"module")
    firmware = ctx.layout.version_dir(V) / "firmware"
    firmware.mkdir(parents=True)
    (firmware / "gsp_ga10x.bin").write_bytes(b"gsp")


def test_a_link_in_the_host_module_tree_is_refused(tmp_path: Path) -> None:
    ctx = context(tmp_path, FakeRunner().on("depmod"))
    _built(ctx)
    base = ctx.root.local(f"/lib/modules/{K}")
    elsewhere = planted_link(base / "updates", tmp_path / "outside/boot")
    with pytest.raises(PlantedLink) as info:
        steps.module_files_step(ctx).apply()
    assert str(base / "updates") in info.value.message
    assert list(elsewhere.iterdir()) == []


def test_a_link_in_the_host_firmware_tree_is_refused(tmp_path: Path) -> None:
    ctx = context(tmp_path, FakeRunner())
    _built(ctx)
    elsewhere = planted_link(ctx.root.local("/lib/firmware/nvidia"), tmp_path / "outside/etc")
    with pytest.raises(PlantedLink):
        steps.firmware_step(ctx).apply()
    assert list(elsewhere.iterdir()) == []


def test_a_planted_firmware_file_link_is_refused(tmp_path: Path) -> None:
    ctx = context(tmp_path, FakeRunner())
    _built(ctx)
    target = victim(tmp_path)
    dest = ctx.root.local(f"/lib/firmware/nvidia/{V}")
    dest.mkdir(parents=True)
    (dest / "gsp_ga10x.bin").symlink_to(target)
    with pytest.raises(PlantedLink):
        steps.firmware_step(ctx).apply()
    untouched(target)


# ----------------------------------------------------------------------------- the helper


def test_safefs_refuses_a_link_anywhere_below_the_anchor(tmp_path: Path) -> None:
    anchor = tmp_path / "anchor"
    elsewhere = planted_link(anchor / "a/b", tmp_path / "elsewhere")
    with pytest.raises(PlantedLink):
        safefs.write_atomic(anchor / "a/b/c/file", "x", anchor=anchor)
    with pytest.raises(PlantedLink):
        safefs.make_dirs(anchor / "a/b/c", anchor=anchor)
    with pytest.raises(PlantedLink):
        safefs.remove_tree(anchor / "a/b/c", anchor=anchor)
    assert list(elsewhere.iterdir()) == []
    safefs.remove_tree(anchor / "a", anchor=anchor)  # the link itself goes, not its target
    assert not (anchor / "a").exists() and elsewhere.is_dir()
