"""Files in directories others can write into, reached without following a link the installer
did not make.

The install dir and its cache are a hostPath that GPU pods and the device plugin mount;
/run/nvidia-driver-installer and the host's module and firmware trees are mounted by other
pods too. A link planted there would turn the installer's writes (as root) into writes to any
host file. So every path below a trusted directory (the `anchor`: the install dir, the cache,
/run, /lib/modules/<kernel>, /lib/firmware, as the configuration names them) is walked one
name at a time from a descriptor of that directory with O_NOFOLLOW: a link anywhere below the
anchor, or a second hard link to a file about to be written, is refused with PlantedLink and
nothing is written, truncated, chmodded, renamed or removed through it. A link the installer
made itself (`current`, `bin`, `drivers`) is never walked through here; removing a link removes
the link, never its target. `anchor=None` trusts the path's parent: only the last name is
guarded.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from installer.errors import HostLayoutError, PlantedLink

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(anchor: Path, path: Path) -> list[str]:
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(anchor))
    if rel == ".":
        return []
    parts = rel.split(os.sep)
    if ".." in parts:
        raise ValueError(f"{path} is not under {anchor}")
    return parts


def planted(path: Path, anchor: Path, what: str = "a symbolic link") -> PlantedLink:
    """The refusal for `path`, naming where the link points when it is one."""
    try:
        target = os.readlink(path)
        where = f" (to {target})"
    except OSError:
        where = ""
    return PlantedLink(
        f"{path} is {what}{where} that the installer did not make; it writes nothing through "
        f"links below {anchor}, so it stopped before touching it"
    )


def _is_link_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _open_below(anchor: Path, parts: list[str], create: bool, mode: int) -> int:
    if create:
        os.makedirs(anchor, exist_ok=True)  # the anchor is trusted as configured
    fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    walked = anchor
    try:
        for name in parts:
            walked = walked / name
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode, dir_fd=fd)
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link_at(fd, name):
                        raise planted(walked, anchor) from None
                    raise
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link_at(fd, name):
                    raise planted(walked, anchor) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def directory(path: Path, *, anchor: Path | None = None, create: bool = False,
              mode: int = 0o755) -> Iterator[int]:
    """A descriptor of directory `path`, every name below `anchor` (default: `path` itself)
    opened without following links; missing ones made with `create`. Raises PlantedLink,
    FileNotFoundError, NotADirectoryError."""
    fd = _open_below(anchor if anchor is not None else path,
                     _parts(anchor if anchor is not None else path, path), create, mode)
    try:
        yield fd
    finally:
        os.close(fd)


def make_dirs(path: Path, *, anchor: Path | None = None, mode: int = 0o755) -> Path:
    """`path` and its missing parents below `anchor` made (a link among them refused)."""
    with directory(path, anchor=anchor, create=True, mode=mode):
        return path


def check(path: Path, *, anchor: Path) -> None:
    """Raises PlantedLink when a name from `anchor` down to `path` (itself included) is a
    link; a missing name ends the check (nothing below it can be a link yet)."""
    parts = _parts(anchor, path)
    if not parts:
        return
    try:
        with directory(path.parent, anchor=anchor) as fd:
            if _is_link_at(fd, path.name):
                raise planted(path, anchor)
    except (FileNotFoundError, NotADirectoryError):
        return


def open_file(path: Path, flags: int, mode: int = 0o600, *,
              anchor: Path | None = None) -> int:
    """os.open of `path` relative to its parent's descriptor with O_NOFOLLOW. A file opened
    for writing must be a regular file with no other name (a hard link planted in the install
    dir would make its truncation another file's). Raises PlantedLink, OSError."""
    base = anchor if anchor is not None else path.parent
    writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    with directory(path.parent, anchor=base, create=bool(flags & os.O_CREAT)) as dir_fd:
        try:
            # O_NONBLOCK: a FIFO planted under the name must not hang the open.
            # O_TRUNC waits for the checks below: a hard link must not lose its bytes first.
            fd = os.open(path.name,
                         (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link_at(dir_fd, path.name):
                raise planted(path, base) from None
            raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HostLayoutError(f"{path} is not a regular file; remove it and run again")
        if writing and info.st_nlink > 1:
            raise planted(path, base, "a file with another name (a hard link)")
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path, *, anchor: Path | None = None) -> bytes:
    """The content of regular file `path`, never read through a link. Raises PlantedLink,
    OSError."""
    fd = open_file(path, os.O_RDONLY, anchor=anchor)
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def is_file(path: Path, *, anchor: Path | None = None) -> bool:
    """Whether `path` is a regular file reached without a link (a link says False)."""
    try:
        with directory(path.parent, anchor=anchor if anchor is not None else path.parent) as fd:
            return stat.S_ISREG(os.lstat(path.name, dir_fd=fd).st_mode)
    except (OSError, PlantedLink):
        return False


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644, *,
                 anchor: Path | None = None) -> Path:
    """`path` replaced by `data` through a new temp file in the same directory (O_EXCL) and one
    rename: readers see the old or the new content. A link at `path` is refused, not
    replaced. Raises PlantedLink, OSError."""
    base = anchor if anchor is not None else path.parent
    payload = data.encode() if isinstance(data, str) else data
    with directory(path.parent, anchor=base, create=True) as dir_fd:
        if _is_link_at(dir_fd, path.name):
            raise planted(path, base)
        tmp = _temp_name(path.name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dir_fd)
        with _renamed_into_place(dir_fd, tmp, path.name), os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
    return path


def _temp_name(name: str) -> str:
    return f".{name}.{secrets.token_hex(4)}"


@contextlib.contextmanager
def _renamed_into_place(dir_fd: int, tmp: str, name: str) -> Iterator[None]:
    """`tmp` renamed over `name` (both in `dir_fd`) once the block has written it; removed
    instead when the block or the rename fails, so no temp file is left behind."""
    try:
        yield
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def rename(source: Path, dest: Path, *, anchor: Path) -> None:
    """os.replace of `source` onto `dest`, both reached from `anchor` without links (a link at
    `dest` is replaced itself, its target untouched)."""
    with directory(source.parent, anchor=anchor) as src_fd, \
            directory(dest.parent, anchor=anchor, create=True) as dst_fd:
        os.replace(source.name, dest.name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)


def unlink(path: Path, *, anchor: Path | None = None) -> None:
    """`path` removed when it is there (a link: the link, never its target)."""
    try:
        with directory(path.parent, anchor=anchor if anchor is not None else path.parent) \
                as fd, contextlib.suppress(FileNotFoundError):
            os.unlink(path.name, dir_fd=fd)
    except (FileNotFoundError, NotADirectoryError):
        return


def remove_tree(path: Path, *, anchor: Path | None = None) -> None:
    """A file, a link (never its target) or a directory tree removed, every name below
    `anchor` reached without following a link; nothing when absent. Raises PlantedLink when
    a directory above `path` is a link."""
    try:
        with directory(path.parent,
                       anchor=anchor if anchor is not None else path.parent) as fd:
            _remove_at(fd, path.name)
    except (FileNotFoundError, NotADirectoryError):
        return


def _remove_at(dir_fd: int, name: str) -> None:
    try:
        info = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        for entry in list(os.scandir(fd)):
            _remove_at(fd, entry.name)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def place_copy(source: Path, dest: Path, *, anchor: Path,
               transform: Callable[[bytes], bytes] | None = None) -> Path:
    """`source` copied to `dest` through a new temp name beside it and one rename, every name
    below `anchor` reached without a link: a regular file keeps its mode and times (its bytes
    through `transform` when given), a symbolic link is copied as the link. A link in `dest`'s
    place is replaced (never written through). Raises PlantedLink, OSError."""
    with directory(dest.parent, anchor=anchor, create=True) as dir_fd:
        tmp = _temp_name(dest.name)
        with _renamed_into_place(dir_fd, tmp, dest.name):
            if source.is_symlink():
                os.symlink(os.readlink(source), tmp, dir_fd=dir_fd)
            else:
                info = source.stat()
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
                with os.fdopen(fd, "wb") as out:
                    if transform is None:
                        with source.open("rb") as src:
                            shutil.copyfileobj(src, out)
                    else:
                        out.write(transform(source.read_bytes()))
                    out.flush()
                    os.fchmod(out.fileno(), stat.S_IMODE(info.st_mode))
                    os.utime(out.fileno(), ns=(info.st_atime_ns, info.st_mtime_ns))
    return dest
