"""Extract a tar archive into a directory, every member confined to it by resolved real paths."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Optional

from installer.errors import ArchiveTooLarge, ArchiveUnsafe

if TYPE_CHECKING:
    import tarfile

# What an archive may unpack to: UNPACK_RATIO times its own size, at least MIN_UNPACKED, each
# member also counting one header block (so a flood of empty members is capped as well). The
# publishers' xz archives of binaries and text unpack to a few times their size; a
# decompression bomb unpacks to thousands of times it.
UNPACK_RATIO = 20
MIN_UNPACKED = 16 << 20
_HEADER = 512
# A pax or GNU long-name record is read whole into memory before its member: real ones hold a
# path or two.
_MAX_EXTENDED_HEADER = 1 << 20

# Far beyond any real archive's names, and well below PATH_MAX: os.path.realpath stops
# resolving links on a path over PATH_MAX, which is how the data filter of Pythons before
# 3.11.13 / 3.12.11 could be walked out of its destination.
_MAX_NAME = 1024


def has_data_filter() -> bool:
    """Whether the running Python's tarfile has the `data` extraction filter."""
    import tarfile

    return hasattr(tarfile, "data_filter")


def unpacked_cap(archive_size: int) -> int:
    """The most bytes an archive of `archive_size` bytes may unpack to (see UNPACK_RATIO)."""
    return max(MIN_UNPACKED, UNPACK_RATIO * archive_size)


def extract(archive: Path, dest: Path, top: str, *, data_filter: Optional[bool] = None,
            max_unpacked: Optional[int] = None) -> Path:
    """Extract `archive` (any compression tarfile reads) into `dest`; every member must lie
    under its one top directory `top`. Returns dest/top.

    Only directories, regular files, symlinks and hard links are extracted. A member is refused
    when its name is absolute or has `..`, when its real parent directory is not the directory
    its name says (it would be written through a link), when a symlink resolves (from the
    link's real location, through links already extracted) outside dest/top, or a hard link
    names anything but a regular member extracted before it. File modes lose setuid, setgid,
    sticky and group/other write bits. The standard library's `data` filter checks each member
    as well where the running Python has it (`data_filter=None`); our own checks always run,
    so both roads refuse the same archives. Members are extracted into a temporary directory
    inside `dest` that is renamed to dest/top on success and removed on any failure: dest never
    holds part of an archive. A name or link holding a NUL byte (which tarfile would cut
    short there) is refused. The members' sizes plus a header block each may not pass
    `max_unpacked` (default unpacked_cap of the archive's size). Raises ArchiveUnsafe naming
    the member and why, or ArchiveTooLarge.
    """
    import lzma
    import tarfile

    use_filter = has_data_filter() if data_filter is None else data_filter
    if use_filter and not has_data_filter():
        raise RuntimeError("this Python's tarfile has no data filter")
    final = dest / top
    dest.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(final):
        raise FileExistsError(final)
    cap = unpacked_cap(archive.stat().st_size) if max_unpacked is None else max_unpacked
    staging = Path(tempfile.mkdtemp(prefix=f".{top}.unpack-", dir=dest))
    try:
        root = Path(os.path.realpath(staging / top))
        try:
            with tarfile.open(archive, "r:*", tarinfo=_strict_info(archive.name)) as tar:
                _Extraction(tar, archive.name, Path(os.path.realpath(staging)), root,
                            use_filter, cap).run()
        except (tarfile.TarError, EOFError, lzma.LZMAError, OSError) as exc:
            raise ArchiveUnsafe(f"{archive.name} cannot be unpacked: {exc}") from None
        os.rename(root, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def file_mode(mode: int) -> int:
    """A regular file's mode as extracted (as the data filter sets it): no setuid, setgid,
    sticky or group/other write; readable and writable by its owner; executable only where
    the owner could execute it."""
    mode &= 0o755
    if not mode & 0o100:
        mode &= ~0o111
    return mode | 0o600


def _cut_at_nul(field: bytes | bytearray) -> bool:
    """Whether a NUL-terminated header field holds bytes after its first NUL: a name tarfile
    would read only up to there (`nv-fabricmanager\\0.orig` as `nv-fabricmanager`)."""
    return field.split(b"\0", 1)[-1].strip(b"\0") != b"" if b"\0" in field else False


def _strict_info(archive: str) -> type[tarfile.TarInfo]:
    """A TarInfo that refuses, as tarfile reads them, headers whose name, link or prefix field
    holds a NUL before more bytes, GNU long names or links that held one, and pax or long-name
    records too large to be a path. Raises ArchiveUnsafe or ArchiveTooLarge (not tarfile's
    HeaderError, which tarfile takes for the end of the archive)."""
    import tarfile

    extended = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)

    class StrictInfo(tarfile.TarInfo):
        @classmethod
        def frombuf(cls, buf: bytes | bytearray, encoding: str,
                    errors: str) -> StrictInfo:
            info = super().frombuf(buf, encoding, errors)
            fields = [buf[0:100], buf[157:257]]
            if buf[257:265] == b"ustar\x0000":  # POSIX: the prefix field is part of the name
                fields.append(buf[345:500])
            if any(_cut_at_nul(field) for field in fields):
                raise ArchiveUnsafe(f"{archive}: member {info.name!r} has a NUL byte inside its "
                                    "name or link in the tar header")
            if info.type in extended and info.size > _MAX_EXTENDED_HEADER:
                raise ArchiveTooLarge(f"{archive}: a pax or long-name record of {info.size} "
                                      f"bytes (more than {_MAX_EXTENDED_HEADER})")
            return info

        def _proc_gnulong(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
            # tarfile keeps a long name or link up to its first NUL; the record's size says
            # how long it was written: the name, its NUL, and (a directory) the slash tarfile
            # strips. Anything longer had bytes after a NUL.
            member: tarfile.TarInfo = super()._proc_gnulong(tar)  # type: ignore[misc]
            text = member.name if self.type == tarfile.GNUTYPE_LONGNAME else member.linkname
            written = len(text.encode(tar.encoding or "utf-8", tar.errors or "strict")) + 1
            if self.size > written + (1 if member.isdir() else 0):
                raise ArchiveUnsafe(f"{archive}: member {text!r} has a NUL byte inside its "
                                    "GNU long name or link")
            return member

    return StrictInfo


class _Extraction:
    def __init__(self, tar: tarfile.TarFile, name: str, staging: Path, root: Path,
                 use_filter: bool, cap: int) -> None:
        self.tar, self.name, self.staging, self.root = tar, name, staging, root
        self.top = root.name
        self.use_filter = use_filter
        self.regular: set[str] = set()  # member names extracted as regular files
        self.cap, self.unpacked = cap, 0

    def refuse(self, member: tarfile.TarInfo, why: str) -> ArchiveUnsafe:
        return ArchiveUnsafe(f"{self.name}: member {member.name!r} {why}")

    def inside(self, path: str) -> bool:
        root = str(self.root)
        return path == root or path.startswith(root + os.sep)

    def run(self) -> None:
        for member in self.tar:
            self.one(member)
        if not self.root.is_dir():
            raise ArchiveUnsafe(f"{self.name} has no {self.top}/ directory")
        self.check_links()

    def one(self, member: tarfile.TarInfo) -> None:
        path = PurePosixPath(member.name)
        if "\0" in member.name or "\0" in member.linkname:  # a pax path or linkpath
            raise self.refuse(member, "has a NUL byte inside its name or link")
        # A hard link adds no bytes; a sparse member counts its full size, as written.
        self.unpacked += _HEADER + (member.size if member.isreg() else 0)
        if self.unpacked > self.cap:
            raise ArchiveTooLarge(f"{self.name}: member {member.name!r} takes the unpacked "
                                  f"size past {self.cap} bytes")
        if len(member.name) > _MAX_NAME or len(member.linkname) > _MAX_NAME:
            raise self.refuse(member, f"has a name or link over {_MAX_NAME} characters")
        if path.is_absolute() or ".." in path.parts:
            raise self.refuse(member, "has an absolute name or `..`")
        if path.parts[:1] != (self.top,):
            raise self.refuse(member, f"lies outside {self.top}/")
        if not (member.isdir() or member.isreg() or member.issym() or member.islnk()):
            raise self.refuse(member, "is a device file, fifo or other special file")
        target = self.staging.joinpath(*path.parts)
        parent = os.path.realpath(target.parent)
        # A member whose real parent differs from its named one would be written through a
        # link: refused even where the link itself points inside.
        if parent != str(target.parent) or not self.inside(str(target)):
            raise self.refuse(member, "would be written through a symlink")
        if os.path.lexists(target) and not (member.isdir() and target.is_dir()
                                             and not target.is_symlink()):
            raise self.refuse(member, "repeats a name already extracted")
        if member.issym():
            if os.path.isabs(member.linkname):
                raise self.refuse(member, f"is a symlink to the absolute {member.linkname!r}")
            resolved = os.path.realpath(os.path.join(parent, member.linkname))
            if not self.inside(resolved):
                raise self.refuse(member, f"is a symlink to {member.linkname!r}, outside "
                                  f"{self.top}/")
        if member.islnk():
            linked = PurePosixPath(member.linkname)
            source = self.staging.joinpath(*linked.parts)
            if (linked.is_absolute() or ".." in linked.parts or member.linkname not in
                    self.regular or os.path.realpath(source) != str(source)
                    or source.is_symlink() or not source.is_file()):
                raise self.refuse(member, f"is a hard link to {member.linkname!r}, not to a "
                                  f"regular file of {self.top}/ extracted before it")
        if self.use_filter:
            self.tar.extract(member, self.staging, set_attrs=True, filter="data")
        else:
            self.write(member, target)
        if member.isreg():
            self.regular.add(member.name)
            os.chmod(target, file_mode(member.mode))
        elif member.islnk():
            self.regular.add(member.name)

    def write(self, member: tarfile.TarInfo, target: Path) -> None:
        # Members may come without their directories; the check above made sure no part of
        # the parent path is a link, so these are real directories under dest.
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if member.isdir():
            target.mkdir(mode=0o755, exist_ok=True)
        elif member.isreg():
            source = self.tar.extractfile(member)
            assert source is not None
            # O_EXCL|O_NOFOLLOW: never through a link placed at the name in the meantime.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with source, open(fd, "wb") as out:
                shutil.copyfileobj(source, out)
        elif member.issym():
            os.symlink(member.linkname, target)
        else:
            os.link(self.staging.joinpath(*PurePosixPath(member.linkname).parts), target,
                    follow_symlinks=False)

    def check_links(self) -> None:
        """Every symlink once all are in place: a later link can change where an earlier one
        resolves (`a/a/../../x` is inside until `a -> .` arrives)."""
        for directory, dirs, files in os.walk(self.root):
            for name in dirs + files:
                path = os.path.join(directory, name)
                if os.path.islink(path) and not self.inside(os.path.realpath(path)):
                    relative = os.path.relpath(path, self.staging)
                    raise ArchiveUnsafe(f"{self.name}: symlink {relative!r} resolves outside "
                                        f"{self.top}/ once the archive's links are all in place")
