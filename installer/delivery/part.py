"""The `.part` file: resume, the running hash of what is on disk, streaming into it."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import queue
import shutil
import stat
import threading
from pathlib import Path
from typing import Any, BinaryIO, Callable, NoReturn, Optional

from installer import safefs
from installer.delivery.progress import Progress
from installer.delivery.transport import Transient
from installer.errors import HostLayoutError, InsufficientSpace

log = logging.getLogger("installer.download")

# Large chunks keep the per-chunk Python overhead (hash update, write, progress check) small
# next to the kernel's copies; four 1 MiB buffers in flight keep memory flat.
CHUNK_SIZE = 1 << 20
PART_SUFFIX = ".part"


class Part:
    """`<name>.part`: what is on disk and the running hash of exactly those bytes.

    `keep_cached=False` is for a file nothing reads soon after (`installer download` filling
    a mirror): what is already on disk leaves the page cache as the transfer goes on, so the
    transfer reuses the same few pages instead of taking a fresh one for every 4 kB written.

    The cache is mounted into GPU pods, so the part is opened from `anchor` (default: its own
    directory) without following a link (PlantedLink), and a descriptor of the file written
    is held until `close()`: a mismatch empties that very file even when something renamed
    it away meanwhile, and the rename into place checks that the verified file is the one
    that lands.
    """

    def __init__(self, path: Path, *, keep_cached: bool = True,
                 anchor: Path | None = None) -> None:
        self.path = path
        self.anchor = anchor if anchor is not None else path.parent
        self.keep_cached = keep_cached
        self._held: int | None = None
        self.hasher = hashlib.sha256()
        self.size = 0
        self.known = False
        self.sources: set[str] = set()
        self.received = 0  # bytes moved over the network/copied by this call

    def sync(self) -> None:
        """Bring the hash up to date with the file (hashes a part left by an earlier run once)."""
        try:
            info = os.lstat(self.path)
            if stat.S_ISLNK(info.st_mode):
                raise safefs.planted(self.path, self.anchor)
            on_disk = info.st_size
        except FileNotFoundError:
            on_disk = -1
        if self.known and on_disk == self.size:
            return
        self.hasher = hashlib.sha256()
        self.size = 0
        self.known = True
        if on_disk <= 0:
            return
        buf = bytearray(CHUNK_SIZE)
        view = memoryview(buf)
        try:
            with os.fdopen(safefs.open_file(self.path, os.O_RDONLY, anchor=self.anchor),
                           "rb") as handle:
                while True:
                    n = handle.readinto(buf)
                    if not n:
                        break
                    self.hasher.update(view[:n])
                    self.size += n
        except OSError as exc:
            log.warning("cannot read %s (%s); starting over", self.path, exc)
            self.reset()
            return
        if self.size:
            log.info("resuming %s from %.1f MB", self.path.name, self.size / 1e6)
            self.sources.add("an earlier run")

    def open_append(self) -> BinaryIO:
        """The part for appending; created, and kept, readable by root only. Raises
        PlantedLink for a link (or a second hard link) in its place."""
        fd = safefs.open_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600,
                              anchor=self.anchor)
        try:
            # A part left by an older installer may be world-readable: the install dir's cache
            # is mounted into GPU pods.
            os.fchmod(fd, 0o600)
            self._hold(fd)
            return os.fdopen(fd, "ab")
        except BaseException:
            os.close(fd)
            raise

    def _hold(self, fd: int) -> None:
        held = os.dup(fd)
        if self._held is not None:
            os.close(self._held)
        self._held = held

    def close(self) -> None:
        """Lets go of the file written (the caller is done with this part)."""
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def landed_at(self, dest: Path) -> bool:
        """Whether `dest` is the very file this part wrote (not one swapped in for it)."""
        if self._held is None:
            return True
        mine = os.fstat(self._held)
        try:
            there = os.lstat(dest)
        except OSError:
            return False
        return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)

    def reset(self) -> None:
        try:
            with self.open_append() as handle:
                handle.truncate(0)
        except OSError as exc:
            raise_write_error(exc, self.path)
        self.hasher = hashlib.sha256()
        self.size = 0
        self.known = True
        self.sources.clear()

    def remove(self) -> None:
        """The bytes written are dropped: the file held is emptied wherever it is now (renamed
        away, or given another name), then the part's name is removed."""
        if self._held is not None:
            os.ftruncate(self._held, 0)
        safefs.unlink(self.path, anchor=self.anchor)
        self.hasher = hashlib.sha256()
        self.size = 0
        self.known = True
        self.sources.clear()


def raise_write_error(exc: OSError, path: Path) -> NoReturn:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise InsufficientSpace(f"no space left writing {path}") from None
    raise HostLayoutError(f"cannot write {path}: {exc.strerror or exc}") from None


def _fail_write(exc: OSError, part: Part) -> NoReturn:
    """A part that filled the disk is dropped: kept, it would leave the node's disk full (with
    no Content-Length nothing warned before the writes)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            part.remove()
        except OSError as remove_exc:
            log.warning("cannot remove %s: %s", part.path, remove_exc)
        raise InsufficientSpace(
            f"no space left writing {part.path}; the partial file was removed"
        ) from None
    raise_write_error(exc, part.path)


def check_space(directory: Path, needed: int, name: str) -> None:
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise InsufficientSpace(
            f"{name} needs {needed / 1e6:.1f} MB in {directory}, only {free / 1e6:.1f} MB free"
        )


class BackgroundHash:
    """Feeds chunks to a hash on a helper thread while the caller receives and writes the next.

    hashlib releases the GIL for large updates, so SHA-256 overlaps the socket and disk work
    instead of adding to it; a few fixed buffers circulate, so memory stays flat.
    """

    def __init__(self, hasher: Any, depth: int = 4) -> None:
        self._hasher = hasher
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        self._todo: queue.SimpleQueue[Optional[tuple[bytearray, int]]] = queue.SimpleQueue()
        for _ in range(depth):
            self._free.put(bytearray(CHUNK_SIZE))
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        self._thread.start()

    def buffer(self) -> bytearray:
        return self._free.get()

    def give_back(self, buf: bytearray) -> None:
        self._free.put(buf)

    def submit(self, buf: bytearray, n: int) -> None:
        self._todo.put((buf, n))

    def _run(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            buf, n = item
            try:
                if self._error is None:
                    self._hasher.update(memoryview(buf)[:n])
            except BaseException as exc:  # surfaced by close() on the caller's thread
                self._error = exc
            finally:
                self._free.put(buf)

    def close(self) -> None:
        """Waits until every submitted chunk is hashed."""
        self._todo.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


# Written bytes are handed to the disk in the background every this many bytes, so the final
# fsync waits for the last stretch only instead of the whole file.
SYNC_EVERY = 32 << 20


class BackgroundSync:
    """fdatasync on a helper thread while the transfer goes on (the call releases the GIL).

    With `drop`, each range it has made durable is then dropped from the page cache: taking
    fresh pages is what a large write mostly costs where memory is lent lazily (a VM whose
    unused memory goes back to the host: each new page is a host fault), and the pages freed
    here are the ones the next writes get.
    """

    def __init__(self, fd: int, *, drop: bool = False) -> None:
        self._fd = fd
        self._drop = drop
        self._dropped = 0  # the file's first this many bytes are durable and out of the cache
        self._wanted = threading.Event()
        self._stop = False
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="fdatasync", daemon=True)
        self._thread.start()

    def request(self) -> None:
        self._wanted.set()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._stop:
                return
            try:
                # Every byte below this size was written before the sync starts, so is synced.
                durable = os.fstat(self._fd).st_size if self._drop else 0
                os.fdatasync(self._fd)
            except OSError as exc:
                self._error = exc
                return
            if durable > self._dropped:
                drop_cached(self._fd, self._dropped, durable - self._dropped)
                self._dropped = durable

    def close(self) -> None:
        """Stops the thread; raises what a background sync ran into (EIO, ENOSPC)."""
        self._stop = True
        self._wanted.set()
        self._thread.join()
        if self._error is not None:
            raise self._error


def drop_cached(fd: int, offset: int, length: int) -> None:
    """Advice only: clean pages of the range leave the page cache; a failure changes nothing."""
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no posix_fadvise
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def pump(
    readinto: Callable[[memoryview], int],
    part: Part,
    progress: Progress,
    read_errors: tuple[type[BaseException], ...],
    describe: Callable[[BaseException], str],
) -> int:
    """Append everything `readinto` yields to the part, hashing as it goes; fsync at the end.

    `readinto` may return fewer bytes than asked (one socket read); each buffer is filled by
    several calls. When the connection breaks, what was already received is still written, so
    the part ends at the exact byte received and a retry resumes there. On any exit the hash
    covers exactly the bytes written to the part.
    """
    got = 0
    try:
        out = part.open_append()
    except OSError as exc:
        raise_write_error(exc, part.path)
    hashing = BackgroundHash(part.hasher)
    syncing: BackgroundSync | None = None
    unsynced = 0
    try:
        with out:
            syncing = BackgroundSync(out.fileno(), drop=not part.keep_cached)
            lost: BaseException | None = None
            while lost is None:
                buf = hashing.buffer()
                view = memoryview(buf)
                n = 0
                try:
                    while n < CHUNK_SIZE:
                        k = readinto(view[n:])
                        if not k:
                            break
                        n += k
                except read_errors as exc:
                    lost = exc
                if not n:
                    hashing.give_back(buf)
                    if lost is None:
                        break
                    continue
                try:
                    out.write(view[:n])
                except OSError as exc:
                    hashing.give_back(buf)
                    part.known = False
                    _fail_write(exc, part)
                hashing.submit(buf, n)
                part.size += n
                part.received += n
                got += n
                progress.update(n)
                unsynced += n
                if unsynced >= SYNC_EVERY:
                    unsynced = 0
                    syncing.request()
                if n < CHUNK_SIZE and lost is None:
                    break  # end of the body
            try:
                out.flush()
                sync_error = None
                try:
                    syncing.close()
                except OSError as exc:
                    sync_error = exc
                syncing = None
                if sync_error is not None:
                    raise sync_error
                if lost is None:
                    os.fsync(out.fileno())
                    if not part.keep_cached:
                        drop_cached(out.fileno(), 0, 0)  # 0: to the end of the file
            except OSError as exc:
                part.known = False
                _fail_write(exc, part)
            if lost is not None:
                raise Transient(
                    f"connection lost after {got} bytes of the body: {describe(lost)}"
                ) from None
    finally:
        if syncing is not None:
            with contextlib.suppress(OSError):
                syncing.close()
        hashing.close()
    return got
