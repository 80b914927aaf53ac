"""The user-space layer's reader against hostile archives: real gzip'd tar files (tarfile writes
whatever it is asked to, as an attacker's tool would), checked against a signed listing that
may itself be hostile. Nothing is ever written outside the destination."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from installer.delivery.userspace_tar import (
    DIR,
    FILE,
    LINK,
    Entry,
    Unpacker,
    check_entries,
    pack,
    scan,
)
from installer.errors import ArtifactInvalid


def _file(path: str, data: bytes, mode: int = 0o644) -> Entry:
    return Entry(path, FILE, mode, len(data), hashlib.sha256(data).hexdigest())


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(raw.getvalue())


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, mode: int = 0o644,
          link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.linkname = kind, size, mode, link
    return info


def _unpack(dest: Path, entries: list[Entry], blob: bytes, chunk: int = 97) -> None:
    unpacker = Unpacker(dest, entries, "test layer")
    try:
        for i in range(0, len(blob), chunk):
            unpacker.feed(blob[i:i + chunk])
        unpacker.finish()
    finally:
        unpacker.close()


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    (tmp_path / "dest").mkdir()
    (tmp_path / "outside").mkdir()
    return tmp_path / "dest"


def test_a_tree_round_trips_with_modes_links_and_the_one_setuid_file(tmp_path: Path,
                                                                     dest: Path) -> None:
    src = tmp_path / "src"
    (src / "lib64").mkdir(parents=True)
    (src / "bin").mkdir()
    (src / "lib64/libnvidia-ml.so.1.2").write_bytes(b"\x7fELF" * 1000)
    os.symlink("libnvidia-ml.so.1.2", src / "lib64/libnvidia-ml.so.1")
    (src / "bin/nvidia-modprobe").write_bytes(b"tool")
    os.chmod(src / "bin/nvidia-modprobe", 0o4755)
    (src / "bin/nvidia-smi").write_bytes(b"smi")
    os.chmod(src / "bin/nvidia-smi", 0o6777)  # masked: never set-id, never writable by others
    paths = ["lib64/libnvidia-ml.so.1.2", "lib64/libnvidia-ml.so.1", "bin/nvidia-modprobe",
             "bin/nvidia-smi"]
    entries = scan(src, paths)

    _unpack(dest, entries, pack(src, entries))

    assert os.readlink(dest / "lib64/libnvidia-ml.so.1") == "libnvidia-ml.so.1.2"
    assert (dest / "lib64/libnvidia-ml.so.1").read_bytes() == b"\x7fELF" * 1000
    assert stat.S_IMODE((dest / "bin/nvidia-modprobe").stat().st_mode) == 0o4755
    assert stat.S_IMODE((dest / "bin/nvidia-smi").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "lib64").stat().st_mode) == 0o755
    assert pack(src, entries) == pack(src, entries)  # the same tree, the same layer


@pytest.mark.parametrize("entry", [
    Entry("../evil", FILE, 0o644, 0, "0" * 64),
    Entry("/etc/passwd", FILE, 0o644, 0, "0" * 64),
    Entry("a/../../b", FILE, 0o644, 0, "0" * 64),
    Entry("link", LINK, target="../../etc/shadow"),
    Entry("link", LINK, target="/etc/shadow"),
    Entry("tool", FILE, 0o4755, 0, "0" * 64),  # setuid, but not nvidia-modprobe
    Entry("tool", FILE, 0o666, 0, "0" * 64),
    Entry("nodir/file", FILE, 0o644, 0, "0" * 64),
    Entry("dev", "chardev", 0o644),
])
def test_a_hostile_listing_is_refused_before_anything_is_written(entry: Entry) -> None:
    with pytest.raises(ArtifactInvalid):
        check_entries([entry], "listing")


def test_a_member_below_a_symlink_is_refused(dest: Path) -> None:
    """The chained-link escape: `top -> ../outside`, then `top/x` would land outside."""
    entries = [Entry("top", DIR, 0o755), _file("top/x", b"pwned")]
    blob = _tar([(_info("top", tarfile.SYMTYPE, link="../outside"), None),
                 (_info("top/x", size=5), b"pwned")])
    with pytest.raises(ArtifactInvalid, match="differs from the signed listing"):
        _unpack(dest, entries, blob)
    assert list((dest.parent / "outside").iterdir()) == []


@pytest.mark.parametrize("kind", [tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE,
                                  tarfile.FIFOTYPE])
def test_hard_links_devices_and_fifos_are_refused(dest: Path, kind: bytes) -> None:
    entries = [_file("x", b"")]
    blob = _tar([(_info("x", kind, link="/etc/passwd" if kind == tarfile.LNKTYPE else ""),
                  None)])
    with pytest.raises(ArtifactInvalid, match="not in the listing"):
        _unpack(dest, entries, blob)
    assert not (dest / "x").exists()


def test_pax_headers_are_refused(dest: Path) -> None:
    """tarfile reads a pax record's body whole into memory: the reader takes ustar only."""
    entries = [_file("x", b"abc")]
    info = tarfile.TarInfo("x")
    info.pax_headers = {"comment": "A" * 1000}
    info.size = 3
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(ArtifactInvalid, match="not in the listing"):
        _unpack(dest, entries, gzip.compress(raw.getvalue()))


@pytest.mark.parametrize("field", ["name", "link"])
def test_a_name_or_link_with_a_nul_byte_is_refused_not_cut_short(dest: Path, field: str) -> None:
    """`x\\0.orig` must not be read as the listed `x`, nor a link `t\\0/..` as `t`."""
    entries = [_file("x", b"abc"), Entry("l", LINK, target="x")]
    raw = bytearray(gzip.decompress(_tar([
        (_info("x^.orig" if field == "name" else "x", size=3), b"abc"),
        (_info("l", tarfile.SYMTYPE, link="x^/../.." if field == "link" else "x"), None)])))
    raw = raw.replace(b"^", b"\0")
    for start in range(0, len(raw), 512):
        if raw[start + 257:start + 262] == b"ustar":
            raw[start + 148:start + 156] = b" " * 8
            raw[start + 148:start + 156] = b"%06o\0 " % sum(raw[start:start + 512])
    with pytest.raises(ArtifactInvalid, match="NUL"):
        _unpack(dest, entries, gzip.compress(bytes(raw)))
    assert not (dest / "l").is_symlink()


def test_other_bytes_than_listed_are_refused(dest: Path) -> None:
    entries = [_file("x", b"genuine")]
    blob = _tar([(_info("x", size=7), b"forgery")])
    with pytest.raises(ArtifactInvalid, match="does not hash to its listed SHA-256"):
        _unpack(dest, entries, blob)


def test_a_member_not_listed_or_listed_but_missing_is_refused(dest: Path, tmp_path: Path) -> None:
    with pytest.raises(ArtifactInvalid, match="not in the listing"):
        _unpack(dest, [_file("x", b"")], _tar([(_info("x"), b""), (_info("y"), b"")]))
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ArtifactInvalid, match="ends without y"):
        _unpack(other, [_file("x", b""), _file("y", b"")], _tar([(_info("x"), b"")]))


def test_a_gzip_bomb_stops_at_the_listed_size(dest: Path) -> None:
    entries = [_file("x", b"a")]
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB of zeros in ~64 KB
    with pytest.raises(ArtifactInvalid, match="more than its listing holds"):
        _unpack(dest, entries, bomb, chunk=1 << 16)


def test_a_cut_or_damaged_layer_is_refused(dest: Path, tmp_path: Path) -> None:
    entries = [_file("x", b"data" * 1000)]
    blob = _tar([(_info("x", size=4000), b"data" * 1000)])
    with pytest.raises(ArtifactInvalid, match="ends early"):
        _unpack(dest, entries, blob[: len(blob) // 2])
    damaged = bytearray(blob)
    damaged[len(blob) // 2] ^= 0xFF
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ArtifactInvalid):
        _unpack(other, entries, bytes(damaged))
    third = tmp_path / "third"
    third.mkdir()
    with pytest.raises(ArtifactInvalid, match="after the end of the gzip stream"):
        _unpack(third, entries, blob + b"trailing")


def _escape_pair() -> list[Entry]:
    """`u -> .` makes `u/u/u/u` the tree itself, so the next link's four `..` climb four levels
    above it although they cancel lexically; its name is the marker install() writes next."""
    return [Entry("u", LINK, target="."),
            Entry(".userspace-artifact.json", LINK, target="u/u/u/u/../../../../victim")]


def _deep_dest(tmp_path: Path) -> Path:
    dest = tmp_path / "a" / "b" / "c" / "d" / "dest"
    dest.mkdir(parents=True)
    return dest


def _files_below(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("entries", [
    _escape_pair(),
    # a top-level dot-name is the installer's own marker or record, never the user space's
    [_file(".userspace-files", b"[]")],
    [Entry(".hidden", DIR, 0o755), _file(".hidden/x", b"")],
    # through a link to a directory that climbs out: `d/up` is the tree itself, so
    # `d/up/d/up/../x` is one level above it (lexically it is d/up/d/x, inside)
    [Entry("d", DIR, 0o755), Entry("d/up", LINK, target=".."),
     Entry("esc", LINK, target="d/up/d/up/../x")],
    # a chain: `d/l1 -> ../l2 -> .` is the tree itself, so `d/l1/../x` is above it
    [Entry("d", DIR, 0o755), Entry("d/l1", LINK, target="../l2"), Entry("l2", LINK, target="."),
     Entry("e", LINK, target="d/l1/../x")],
    [Entry("loop1", LINK, target="loop2/x"), Entry("loop2", LINK, target="loop1/x")],
])
def test_links_that_resolve_outside_through_other_links_are_refused(
        tmp_path: Path, entries: list[Entry]) -> None:
    before = _files_below(tmp_path)
    with pytest.raises(ArtifactInvalid):
        check_entries(entries, "listing")
    dest = _deep_dest(tmp_path)
    with pytest.raises(ArtifactInvalid):
        Unpacker(dest, entries, "test layer")
    assert _files_below(tmp_path) - before == {"a", "a/b", "a/b/c", "a/b/c/d", "a/b/c/d/dest"}


def test_the_escape_pair_cannot_be_packed_or_unpacked(tmp_path: Path) -> None:
    """The whole attack: a signed listing of the pair, its layer, then install()'s marker
    written through the link. Refused before anything is written; nothing lands outside."""
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(".", src / "u")
    os.symlink("u/u/u/u/../../../../victim", src / ".userspace-artifact.json")
    with pytest.raises(ArtifactInvalid):
        scan(src, ["u", ".userspace-artifact.json"])
    dest = _deep_dest(tmp_path)
    blob = _tar([(_info("u", tarfile.SYMTYPE, link="."), None),
                 (_info(".userspace-artifact.json", tarfile.SYMTYPE,
                        link="u/u/u/u/../../../../victim"), None)])
    with pytest.raises(ArtifactInvalid):
        _unpack(dest, _escape_pair(), blob)
    assert list(dest.iterdir()) == []
    assert list(tmp_path.rglob("victim")) == []


def test_links_that_stay_inside_through_other_links_are_kept(dest: Path) -> None:
    entries = [Entry("lib64", DIR, 0o755), Entry("lib", LINK, target="lib64"),
               Entry("lib64/self", LINK, target="../lib/."),
               Entry("x", LINK, target="lib/self/self/../lib64/libfoo.so")]
    assert len(check_entries(entries, "listing")) == 4


def test_a_placed_link_that_escapes_is_refused_after_unpacking(
        dest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Belt and braces: were the listing's resolver wrong, the placed links are checked by
    their real paths before the tree is used."""
    import installer.delivery.userspace_tar as userspace_tar

    entries = [Entry("u", LINK, target="."), Entry("v", LINK, target="u/u/../../outside")]
    monkeypatch.setattr(userspace_tar, "check_entries", lambda found, what: sorted(
        found, key=lambda e: e.path.split("/")))
    blob = _tar([(_info("u", tarfile.SYMTYPE, link="."), None),
                 (_info("v", tarfile.SYMTYPE, link="u/u/../../outside"), None)])
    with pytest.raises(ArtifactInvalid, match="leaves"):
        _unpack(dest, entries, blob)
