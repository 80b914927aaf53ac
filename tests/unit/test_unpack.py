"""installer.delivery.unpack and fm_archive.unpack against hostile tar.xz archives built here:
chained and absolute symlinks, links to `..`, hard links out, device files, fifos, `..` and
absolute names, setuid bits. Each case runs through the standard library's data filter (where
this Python has it) and through the real-path fallback; both must refuse, leave nothing outside
and leave the destination without part of the archive."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path
from typing import Any, Callable

import pytest

from installer.components import fm_archive
from installer.delivery import unpack
from installer.errors import ArchiveTooLarge, ArchiveUnsafe, FabricManagerMismatch

TOP = "fabricmanager-linux-x86_64-580.105.08-archive"
ROADS = [
    pytest.param(True, id="data-filter", marks=pytest.mark.skipif(
        not unpack.has_data_filter(), reason="this Python's tarfile has no data filter")),
    pytest.param(False, id="real-path-fallback"),
]

Member = Callable[[tarfile.TarFile], None]


def _add(tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, *, data: bytes = b"",
         link: str = "", mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = kind, link, mode, 1704067200
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def d(name: str) -> Member:
    return lambda tar: _add(tar, name, tarfile.DIRTYPE, mode=0o755)


def f(name: str, data: bytes = b"pwned\n", mode: int = 0o644) -> Member:
    return lambda tar: _add(tar, name, data=data, mode=mode)


def sym(name: str, link: str) -> Member:
    return lambda tar: _add(tar, name, tarfile.SYMTYPE, link=link, mode=0o777)


def hard(name: str, link: str) -> Member:
    return lambda tar: _add(tar, name, tarfile.LNKTYPE, link=link)


def special(name: str, kind: bytes) -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.devmajor, info.devminor = kind, 0o666, 1, 3
        tar.addfile(info)
    return add


def archive(tmp_path: Path, *members: Member) -> Path:
    path = tmp_path / "mirror" / f"{TOP}.tar.xz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:xz") as tar:
        for add in members:
            add(tar)
    return path


def good_members() -> list[Member]:
    """Fabric Manager's layout (tests/kit/fabricmanager.py), its library links included."""
    return [d(TOP), d(f"{TOP}/bin"), d(f"{TOP}/lib"), d(f"{TOP}/etc"),
            f(f"{TOP}/bin/nv-fabricmanager", b"#!/bin/sh\n", 0o755),
            f(f"{TOP}/etc/fabricmanager.cfg", b"LOG_LEVEL=4\n"),
            f(f"{TOP}/lib/libnvfm.so.580.105.08", b"\x7fELF"),
            sym(f"{TOP}/lib/libnvfm.so.1", "libnvfm.so.580.105.08"),
            sym(f"{TOP}/lib/libnvfm.so", "libnvfm.so.1")]


HOSTILE: dict[str, list[Member]] = {
    # The attack as reported: x -> . makes x/x/x/x/x the top directory itself, so y climbs
    # four levels from there; y/pwned.txt is then written through y.
    "chained-symlinks": [d(TOP), sym(f"{TOP}/x", "."),
                         sym(f"{TOP}/x/x/x/x/x/y", "../../../../OUTSIDE"),
                         f(f"{TOP}/y/pwned.txt")],
    # The same links without the file: the link alone must not be left pointing out.
    "chained-symlink-alone": [d(TOP), sym(f"{TOP}/x", "."),
                              sym(f"{TOP}/x/x/x/x/x/y", "../../../../OUTSIDE")],
    # Inside when placed, outside once a later link arrives.
    "link-changed-by-a-later-link": [d(TOP), d(f"{TOP}/b"),
                                     sym(f"{TOP}/b/l", "a/a/../../../../OUTSIDE/pwned.txt"),
                                     sym(f"{TOP}/b/a", ".")],
    "absolute-symlink": [d(TOP), sym(f"{TOP}/passwd", "/etc/passwd")],
    "symlink-to-dotdot": [d(TOP), sym(f"{TOP}/up", ".."), f(f"{TOP}/up/pwned.txt")],
    "symlink-to-dotdot-alone": [d(TOP), sym(f"{TOP}/up", "..")],
    "hard-link-to-etc-passwd": [d(TOP), hard(f"{TOP}/passwd", "/etc/passwd")],
    "hard-link-outside": [d(TOP), hard(f"{TOP}/out", "../OUTSIDE/secret")],
    "hard-link-through-a-symlink": [d(TOP), sym(f"{TOP}/s", "../OUTSIDE"),
                                    hard(f"{TOP}/h", f"{TOP}/s/secret")],
    "hard-link-to-a-later-member": [d(TOP), hard(f"{TOP}/h", f"{TOP}/later"),
                                    f(f"{TOP}/later")],
    "char-device": [d(TOP), special(f"{TOP}/null", tarfile.CHRTYPE)],
    "block-device": [d(TOP), special(f"{TOP}/sda", tarfile.BLKTYPE)],
    "fifo": [d(TOP), special(f"{TOP}/pipe", tarfile.FIFOTYPE)],
    "dotdot-name": [d(TOP), f("../OUTSIDE/pwned.txt")],
    "dotdot-inside-name": [d(TOP), f(f"{TOP}/../../OUTSIDE/pwned.txt")],
    "absolute-name": [d(TOP), f("/abs/pwned.txt")],
    "outside-the-top-directory": [d(TOP), f("other/pwned.txt")],
    "file-over-a-symlink": [d(TOP), sym(f"{TOP}/cfg", "../OUTSIDE/pwned.txt"),
                            f(f"{TOP}/cfg")],
}


def snapshot(base: Path) -> dict[str, object]:
    """Every path under `base` (links not followed) with its content or link target."""
    seen: dict[str, object] = {}
    for directory, dirs, files in os.walk(base):
        for name in dirs + files:
            path = Path(directory, name)
            seen[str(path.relative_to(base))] = (
                os.readlink(path) if path.is_symlink() else
                path.read_bytes() if path.is_file() else "dir")
    return seen


def nest(tmp_path: Path) -> Path:
    """A destination four levels deep, with an OUTSIDE/secret at each level a climb can reach."""
    dest = tmp_path / "a" / "b" / "c" / "unpacked"
    for level in (tmp_path, *list(dest.parents)[:4], dest):
        (level / "OUTSIDE").mkdir(parents=True, exist_ok=True)
        (level / "OUTSIDE" / "secret").write_bytes(b"secret\n")
    return dest


@pytest.mark.parametrize("data_filter", ROADS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_archive_is_refused_and_nothing_lands_anywhere(
        tmp_path: Path, case: str, data_filter: bool) -> None:
    dest = nest(tmp_path)
    source = archive(tmp_path / "a", *HOSTILE[case])
    before = snapshot(tmp_path)
    with pytest.raises(ArchiveUnsafe) as info:
        unpack.extract(source, dest, TOP, data_filter=data_filter)
    assert info.value.reference == "archive-unsafe" and info.value.exit_code == 62
    assert source.name in info.value.message
    assert snapshot(tmp_path) == before  # nothing written outside, no partial content inside


@pytest.mark.parametrize("data_filter", ROADS)
def test_the_error_names_the_member_and_why(tmp_path: Path, data_filter: bool) -> None:
    source = archive(tmp_path, *HOSTILE["chained-symlinks"])
    with pytest.raises(ArchiveUnsafe) as info:
        unpack.extract(source, tmp_path / "unpacked", TOP, data_filter=data_filter)
    assert f"member '{TOP}/x/x/x/x/x/y'" in info.value.message
    assert "symlink" in info.value.message and info.value.hint

    source = archive(tmp_path, d(TOP), special(f"{TOP}/null", tarfile.CHRTYPE))
    with pytest.raises(ArchiveUnsafe, match=rf"member '{TOP}/null' is a device file"):
        unpack.extract(source, tmp_path / "unpacked", TOP, data_filter=data_filter)


@pytest.mark.parametrize("data_filter", ROADS)
def test_fabric_managers_layout_unpacks_with_its_links_and_no_setuid(
        tmp_path: Path, data_filter: bool) -> None:
    members = [*good_members(), f(f"{TOP}/bin/nvswitch-audit", b"#!/bin/sh\n", 0o6777),
               f(f"{TOP}/LICENSE", b"text\n", 0o666),
               hard(f"{TOP}/LICENSE.copy", f"{TOP}/LICENSE")]
    dest = tmp_path / "unpacked"
    tree = unpack.extract(archive(tmp_path, *members), dest, TOP, data_filter=data_filter)
    assert tree == dest / TOP
    assert sorted(p.name for p in dest.iterdir()) == [TOP]  # no staging left behind
    lib = tree / "lib"
    assert os.readlink(lib / "libnvfm.so.1") == "libnvfm.so.580.105.08"
    assert os.readlink(lib / "libnvfm.so") == "libnvfm.so.1"
    assert (lib / "libnvfm.so").read_bytes() == b"\x7fELF"
    assert stat.S_IMODE((tree / "bin/nv-fabricmanager").stat().st_mode) == 0o755
    assert stat.S_IMODE((tree / "bin/nvswitch-audit").stat().st_mode) == 0o755  # not 6777
    assert stat.S_IMODE((tree / "LICENSE").stat().st_mode) == 0o644  # not world-writable
    assert (tree / "LICENSE.copy").stat().st_ino == (tree / "LICENSE").stat().st_ino


def test_the_fallback_is_used_where_python_has_no_data_filter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    assert not unpack.has_data_filter()
    tree = unpack.extract(archive(tmp_path, *good_members()), tmp_path / "a", TOP)
    assert os.readlink(tree / "lib/libnvfm.so.1") == "libnvfm.so.580.105.08"
    dest = nest(tmp_path / "b")
    source = archive(tmp_path / "b" / "a", *HOSTILE["chained-symlinks"])
    before = snapshot(tmp_path / "b")
    with pytest.raises(ArchiveUnsafe):
        unpack.extract(source, dest, TOP)
    assert snapshot(tmp_path / "b") == before


def test_fm_archive_unpack_refuses_the_reported_attack(tmp_path: Path) -> None:
    dest = nest(tmp_path)
    source = archive(tmp_path / "a", *HOSTILE["chained-symlinks"])
    before = snapshot(tmp_path)
    with pytest.raises(ArchiveUnsafe):
        fm_archive.unpack(source, dest)
    assert snapshot(tmp_path) == before
    assert not list(tmp_path.glob("**/pwned.txt"))


def test_fm_archive_unpack_returns_the_top_directory_and_needs_the_daemon(
        tmp_path: Path) -> None:
    tree = fm_archive.unpack(archive(tmp_path, *good_members()), tmp_path / "u")
    assert tree == tmp_path / "u" / TOP and (tree / "bin/nv-fabricmanager").is_file()
    without = [m for i, m in enumerate(good_members()) if i != 4]
    with pytest.raises(FabricManagerMismatch, match="no bin/nv-fabricmanager"):
        fm_archive.unpack(archive(tmp_path, *without), tmp_path / "v")


def test_an_unreadable_archive_is_a_clear_error(tmp_path: Path) -> None:
    source = tmp_path / f"{TOP}.tar.xz"
    source.write_bytes(b"\xfd7zXZ\x00 not really")
    with pytest.raises(ArchiveUnsafe, match="cannot be unpacked"):
        unpack.extract(source, tmp_path / "u", TOP)
    assert list((tmp_path / "u").iterdir()) == []


# --------------------------------------------------------------- NUL in names, unpacked size


def with_nul(tmp_path: Path, members: list[Member], fmt: int = tarfile.GNU_FORMAT) -> Path:
    """The archive with every `^` of its raw tar stream turned into a NUL byte (in a header's
    name or link field, a GNU long-name record or a pax record), header checksums made right
    again: what a crafted archive holds, which tarfile cuts at the NUL."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt) as tar:
        for add in members:
            add(tar)
    data = bytearray(raw.getvalue().replace(b"^", b"\0"))
    for start in range(0, len(data), 512):
        block = data[start:start + 512]
        if block[257:262] == b"ustar":
            block[148:156] = b" " * 8
            block[148:156] = b"%06o\0 " % sum(block)
            data[start:start + 512] = block
    path = tmp_path / "mirror" / f"{TOP}.tar.xz"
    path.parent.mkdir(parents=True, exist_ok=True)
    import lzma

    path.write_bytes(lzma.compress(bytes(data)))
    return path


LONG = "x" * 120  # past ustar's 100-character name field: a GNU long-name record or pax path
NUL_NAMES: dict[str, tuple[list[Member], int]] = {
    # tarfile reads `nv-fabricmanager^.orig` as `nv-fabricmanager`: a member the listing never
    # showed lands under the daemon's name.
    "ustar-name": ([d(TOP), d(f"{TOP}/bin"), f(f"{TOP}/bin/nv-fabricmanager^.orig")],
                   tarfile.USTAR_FORMAT),
    "ustar-link": ([d(TOP), sym(f"{TOP}/lib", "real^/../../OUTSIDE")], tarfile.USTAR_FORMAT),
    "gnu-long-name": ([d(TOP), f(f"{TOP}/{LONG}^/../pwned.txt")], tarfile.GNU_FORMAT),
    "gnu-long-link": ([d(TOP), sym(f"{TOP}/l", f"{LONG}^/../../OUTSIDE")], tarfile.GNU_FORMAT),
    "pax-path": ([d(TOP), f(f"{TOP}/{LONG}^.txt")], tarfile.PAX_FORMAT),
}


@pytest.mark.parametrize("data_filter", ROADS)
@pytest.mark.parametrize("case", sorted(NUL_NAMES))
def test_a_name_with_a_nul_byte_is_refused_not_cut_short(
        tmp_path: Path, case: str, data_filter: bool) -> None:
    members, fmt = NUL_NAMES[case]
    dest = nest(tmp_path)
    source = with_nul(tmp_path / "a", members, fmt)
    before = snapshot(tmp_path)
    with pytest.raises(ArchiveUnsafe, match="NUL") as info:
        unpack.extract(source, dest, TOP, data_filter=data_filter)
    assert info.value.reference == "archive-unsafe" and source.name in info.value.message
    assert snapshot(tmp_path) == before


def test_names_without_nul_in_every_format_still_unpack(tmp_path: Path) -> None:
    """The NUL check reads the raw fields: padding NULs after a name, GNU long names and pax
    paths of a real archive must pass."""
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        members = [d(TOP), d(f"{TOP}/bin"), f(f"{TOP}/bin/nv-fabricmanager", b"#!/bin/sh\n")]
        if fmt != tarfile.USTAR_FORMAT:
            members += [d(f"{TOP}/{LONG}"), f(f"{TOP}/{LONG}/{LONG}"),
                        sym(f"{TOP}/l", f"{LONG}/{LONG}")]
        tree = unpack.extract(with_nul(tmp_path / str(fmt), members, fmt),
                              tmp_path / f"u{fmt}", TOP)
        assert (tree / "bin/nv-fabricmanager").read_bytes() == b"#!/bin/sh\n"
        if fmt != tarfile.USTAR_FORMAT:
            assert (tree / "l").resolve() == (tree / LONG / LONG).resolve()


def zeros(name: str, size: int) -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = size, 0o644

        class Zeros(io.RawIOBase):
            def readable(self) -> bool:
                return True

            def readinto(self, b: Any) -> int:
                b[:] = bytes(len(b))
                return len(b)

        tar.addfile(info, io.BufferedReader(Zeros()))
    return add


@pytest.mark.parametrize("data_filter", ROADS)
def test_an_archive_unpacking_past_the_cap_is_refused_and_nothing_is_left(
        tmp_path: Path, data_filter: bool) -> None:
    """A few KiB of xz that unpack to far more than any real archive of its size: refused
    before the member that crosses the cap is written, and the partial tree removed."""
    size = unpack.MIN_UNPACKED + 1
    source = archive(tmp_path / "a", d(TOP), f(f"{TOP}/first"), zeros(f"{TOP}/bomb", size))
    assert source.stat().st_size * unpack.UNPACK_RATIO < unpack.MIN_UNPACKED
    dest = tmp_path / "u"
    with pytest.raises(ArchiveTooLarge) as info:
        unpack.extract(source, dest, TOP, data_filter=data_filter)
    assert info.value.reference == "archive-too-large" and info.value.exit_code == 124
    assert f"member '{TOP}/bomb'" in info.value.message and info.value.hint
    assert list(dest.iterdir()) == []


def test_the_cap_is_a_multiple_of_the_archive_with_a_floor(tmp_path: Path) -> None:
    assert unpack.unpacked_cap(1000) == unpack.MIN_UNPACKED
    big = unpack.MIN_UNPACKED  # an archive this large may unpack to RATIO times it
    assert unpack.unpacked_cap(big) == big * unpack.UNPACK_RATIO
    # Many empty members count too (each costs a header block): no inode flood.
    members = [d(TOP)] + [f(f"{TOP}/{i}", b"") for i in range(50)]
    source = archive(tmp_path, *members)
    with pytest.raises(ArchiveTooLarge):
        unpack.extract(source, tmp_path / "u", TOP, max_unpacked=20 * 512)
    tree = unpack.extract(source, tmp_path / "v", TOP, max_unpacked=60 * 512)
    assert len(list(tree.iterdir())) == 50


def test_fm_archive_unpack_applies_the_cap(tmp_path: Path) -> None:
    source = archive(tmp_path, *good_members(),
                     zeros(f"{TOP}/share/bomb", unpack.MIN_UNPACKED + 1))
    with pytest.raises(ArchiveTooLarge):
        fm_archive.unpack(source, tmp_path / "u")
