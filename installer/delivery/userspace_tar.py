"""A driver's user-space tree as one gzip'd ustar layer: list it, pack it, and unpack a layer
while it streams in, confined to a fresh directory and checked against the signed listing.

The reader is our own and strict (not tarfile's): plain ustar headers only (no pax or GNU
records, whose bodies tarfile reads whole into memory), regular files, directories and
relative symlinks that stay inside the tree, nothing else. A member is written only below a
directory this archive created (never through a symlink), with O_EXCL|O_NOFOLLOW, and with the
listed mode, which never has set-id, sticky or group/world-write bits, but for the one file
nvidia-installer itself makes setuid root (SETUID). A link is confined by where it really
resolves, through the listing's other links, not by its text alone.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import stat
import tarfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from installer.errors import ArtifactInvalid

MODE_MASK = 0o755  # what a listed mode may hold: no set-id, sticky or group/world write
# nvidia-installer installs nvidia-modprobe setuid root (libcuda runs it to create device nodes
# for unprivileged users); that exact file at that exact mode, nothing else.
SETUID = {"bin/nvidia-modprobe": 0o4755}
_BLOCK = 512
_CHUNK = 1 << 20
DIR, FILE, LINK = "dir", "file", "symlink"


@dataclass(frozen=True)
class Entry:
    """One member of the tree: its relative path, kind, mode, and size + SHA-256 (files) or
    target (symlinks)."""

    path: str
    kind: str
    mode: int = 0
    size: int = 0
    sha256: str = ""
    target: str = ""

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "type": self.kind}
        if self.kind == LINK:
            out["target"] = self.target
        else:
            out["mode"] = self.mode
        if self.kind == FILE:
            out.update(size=self.size, sha256=self.sha256)
        return out


def safe_path(path: str) -> bool:
    """A relative path of plain components (no '', '.', '..', NUL, backslash tricks)."""
    parts = path.split("/")
    return bool(path) and len(path) <= 255 and all(
        p not in ("", ".", "..") and "\0" not in p for p in parts)


def safe_target(path: str, target: str) -> bool:
    """A symlink target that is relative and, read lexically from the link's directory, stays
    in the tree (the first check; `resolve` then follows the listing's other links)."""
    if not target or target.startswith("/") or "\0" in target or len(target) > 100:
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return joined != ".." and not joined.startswith("../") and not joined.startswith("/")


_MAX_HOPS = 40  # the kernel's own limit on links followed in one lookup (ELOOP)


def resolve(links: dict[str, str], directory: str, target: str) -> str | None:
    """Where `target`, read from `directory`, lands in the tree once every listed link on the
    way is followed, component by component as the kernel walks a path ('' is the tree's
    top), or None where it climbs above the tree or loops. A lexical normpath is not enough:
    through `u -> .` the path `u/u/..` is one level above the tree, not inside it."""
    hops = 0

    def walk(directory: str, target: str) -> str | None:
        nonlocal hops
        current = directory.split("/") if directory else []
        for part in target.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not current:
                    return None
                current.pop()
                continue
            candidate = "/".join([*current, part])
            if candidate not in links:
                current.append(part)
                continue
            hops += 1
            if hops > _MAX_HOPS or links[candidate].startswith("/"):
                return None
            landed = walk("/".join(current), links[candidate])
            if landed is None:
                return None
            current = landed.split("/") if landed else []
        return "/".join(current)

    return walk(directory, target)


def check_entries(entries: Iterable[Entry], what: str) -> list[Entry]:
    """The listing in tar order (parents first), refused unless every path is safe and unique,
    every parent a listed directory, every mode within MODE_MASK and every link confined, also
    through the listing's other links. No top-level dot-name: those are the installer's own
    markers and records beside the user space (a listed `.marker -> ...` link would have
    install() write its marker wherever the link points)."""
    found = sorted(entries, key=lambda e: e.path.split("/"))
    kinds: dict[str, str] = {}
    for entry in found:
        if not safe_path(entry.path) or entry.path in kinds:
            raise ArtifactInvalid(f"{what}: bad or repeated path {entry.path!r}")
        if entry.path.startswith("."):
            raise ArtifactInvalid(f"{what}: {entry.path!r} is a top-level dot-name, which only "
                                  "the installer's own markers and records use")
        parent = posixpath.dirname(entry.path)
        if parent and kinds.get(parent) != DIR:
            raise ArtifactInvalid(f"{what}: {entry.path!r} is not below a listed directory")
        if entry.kind not in (DIR, FILE, LINK):
            raise ArtifactInvalid(f"{what}: {entry.path!r} is a {entry.kind!r}")
        if entry.kind != LINK and (entry.mode & ~MODE_MASK or entry.mode < 0) and not (
                entry.kind == FILE and SETUID.get(entry.path) == entry.mode):
            raise ArtifactInvalid(f"{what}: {entry.path!r} has mode {entry.mode:o} (set-id, "
                                  "sticky or writable by others)")
        if entry.kind == LINK and not safe_target(entry.path, entry.target):
            raise ArtifactInvalid(f"{what}: the link {entry.path!r} -> {entry.target!r} leaves "
                                  "the tree")
        if entry.kind == FILE and (entry.size < 0 or len(entry.sha256) != 64):
            raise ArtifactInvalid(f"{what}: {entry.path!r} has no size or SHA-256")
        kinds[entry.path] = entry.kind
    links = {e.path: e.target for e in found if e.kind == LINK}
    for path, target in links.items():
        if resolve(links, posixpath.dirname(path), target) is None:
            raise ArtifactInvalid(f"{what}: the link {path!r} -> {target!r} leaves the tree "
                                  "through other links, or loops")
    return found


def scan(tree: Path, paths: Iterable[str]) -> list[Entry]:
    """The entries of `paths` (relative to `tree`; their parent directories added), files
    hashed. Raises ArtifactInvalid for anything that is not a file, directory or symlink."""
    wanted = set(paths)
    for path in list(wanted):
        parent = posixpath.dirname(path)
        while parent:
            wanted.add(parent)
            parent = posixpath.dirname(parent)
    entries = []
    for path in sorted(wanted, key=lambda p: p.split("/")):
        local = tree / path
        info = os.lstat(local)
        if stat.S_ISLNK(info.st_mode):
            entries.append(Entry(path, LINK, target=os.readlink(local)))
        elif stat.S_ISDIR(info.st_mode):
            entries.append(Entry(path, DIR, stat.S_IMODE(info.st_mode) & MODE_MASK))
        elif stat.S_ISREG(info.st_mode):
            hashed = hashlib.sha256()
            with local.open("rb") as handle:
                for block in iter(lambda: handle.read(_CHUNK), b""):
                    hashed.update(block)
            mode = stat.S_IMODE(info.st_mode)
            if SETUID.get(path) != mode:
                mode &= MODE_MASK
            entries.append(Entry(path, FILE, mode, info.st_size, hashed.hexdigest()))
        else:
            raise ArtifactInvalid(f"{local} is neither a file, a directory nor a symlink")
    return check_entries(entries, str(tree))


def pack(tree: Path, entries: list[Entry], level: int = 1) -> bytes:
    """The gzip'd ustar layer of `entries` (owner 0, mtime 0: the same tree gives the same
    bytes). Level 1: NVIDIA's 535 user space packs to 53 MB in 4 s, level 6 to 50 MB in 7 s
    (inflating costs the same). Raises ArtifactInvalid for a name ustar cannot hold."""
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=level,
                       mtime=0) as gz, tarfile.open(fileobj=gz, mode="w",
                                                    format=tarfile.USTAR_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o777 if entry.kind == LINK else entry.mode
            try:
                if entry.kind == FILE:
                    info.size = entry.size
                    with (tree / entry.path).open("rb") as handle:
                        tar.addfile(info, handle)
                    continue
                info.type = tarfile.DIRTYPE if entry.kind == DIR else tarfile.SYMTYPE
                info.linkname = entry.target
                tar.addfile(info)
            except ValueError as exc:  # ustar's 100/155-character limits
                raise ArtifactInvalid(f"{entry.path}: {exc}") from None
    return out.getvalue()


def _octal(field: bytes) -> int:
    text = field.rstrip(b"\0 ").lstrip(b" ")
    if not text or not all(48 <= c <= 55 for c in text):
        raise ValueError(f"not an octal number: {field!r}")
    return int(text, 8)


def _text(field: bytes) -> str:
    text, _, rest = field.partition(b"\0")
    if rest.strip(b"\0"):
        # Read up to the NUL, `x\0.orig` would pass for the listed `x`.
        raise ValueError(f"a NUL byte inside the name or link {text!r}")
    return text.decode("utf-8")


class Unpacker:
    """Feed it a gzip'd ustar layer in chunks as they arrive; it writes the listed `entries`
    below `dest` (an empty directory) and refuses anything else. `finish()` says whether the
    layer was whole; the caller checks the layer's digest and drops `dest` on any error."""

    def __init__(self, dest: Path, entries: list[Entry], what: str) -> None:
        self.dest, self.what = dest, what
        self.expected = {e.path: e for e in check_entries(entries, what)}
        self.made = {""}  # directories this archive created: the only ones written below
        self.seen: set[str] = set()
        self.buffer = bytearray()
        self.inflate = zlib.decompressobj(wbits=31)  # gzip
        # The tar stream can never be longer than its listing says (headers, data, padding,
        # tarfile's 10 KiB records): a bigger one is refused as it inflates (no gzip bomb).
        self.budget = sum(_BLOCK + -(-e.size // _BLOCK) * _BLOCK
                          for e in entries) + 20 * _BLOCK + 10240
        self.fd: int | None = None
        self.current: Entry | None = None
        self.hashed = hashlib.sha256()
        self.left = 0  # bytes of the current file still to come
        self.pad = 0  # padding after it
        self.ended = False

    def _bad(self, why: str) -> ArtifactInvalid:
        return ArtifactInvalid(f"{self.what}: {why}")

    def feed(self, chunk: bytes) -> None:
        data = chunk
        while data:
            try:
                out = self.inflate.decompress(data, _CHUNK)
            except zlib.error as exc:  # a damaged layer: its digest would not match either
                raise self._bad(f"the layer is no valid gzip stream ({exc})") from None
            data = self.inflate.unconsumed_tail
            self.budget -= len(out)
            if self.budget < 0:
                raise self._bad("the layer unpacks to more than its listing holds")
            if out:
                self._tar(memoryview(out))
            if self.inflate.eof:
                if data or self.inflate.unused_data:
                    raise self._bad("bytes after the end of the gzip stream")
                return

    def _tar(self, data: memoryview) -> None:
        while len(data):
            if self.left:
                piece = data[: self.left]
                assert self.fd is not None
                os.write(self.fd, piece)
                self.hashed.update(piece)
                self.left -= len(piece)
                data = data[len(piece):]
                if not self.left:
                    self._close_file()
                continue
            if self.pad:
                skip = min(self.pad, len(data))
                self.pad -= skip
                data = data[skip:]
                continue
            need = _BLOCK - len(self.buffer)
            self.buffer += data[:need]
            data = data[need:]
            if len(self.buffer) == _BLOCK:
                header = bytes(self.buffer)
                self.buffer.clear()
                self._header(header)

    def _header(self, block: bytes) -> None:
        if self.ended:
            if block.strip(b"\0"):
                raise self._bad("data after the end of the archive")
            return
        if not block.strip(b"\0"):
            self.ended = len(self.seen) == len(self.expected) or self._missing()
            return
        try:
            checksum = _octal(block[148:156])
            size = _octal(block[124:136])
            name = _text(block[0:100])
            prefix = _text(block[345:500])
            linkname = _text(block[157:257])
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._bad(f"a malformed tar header ({exc})") from None
        if checksum != sum(block[:148]) + 8 * 32 + sum(block[156:]) or block[257:265] != (
                b"ustar\x0000"):
            raise self._bad("a tar header that is not plain ustar or fails its checksum")
        path = f"{prefix}/{name}" if prefix else name
        kind = {b"0": FILE, b"\0": FILE, b"5": DIR, b"2": LINK}.get(block[156:157])
        path = path.rstrip("/") if kind == DIR else path
        entry = self.expected.get(path)
        if kind is None or entry is None or path in self.seen:
            raise self._bad(f"member {path!r} (type {block[156:157]!r}) is not in the listing "
                            "or comes twice (hard links, devices and fifos are refused)")
        self.seen.add(path)
        if entry.kind != kind or (kind == FILE and size != entry.size) or (
                kind == LINK and linkname != entry.target) or (kind != FILE and size):
            raise self._bad(f"member {path!r} differs from the signed listing")
        parent = posixpath.dirname(path)
        if parent not in self.made:  # never below a link, never before its directory
            raise self._bad(f"member {path!r} comes before its directory")
        target = self.dest / path
        if kind == DIR:
            os.mkdir(target, 0o700)
            self.made.add(path)
        elif kind == LINK:
            os.symlink(entry.target, target)
        else:
            self.fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                              0o600)
            self.current, self.hashed = entry, hashlib.sha256()
            self.left, self.pad = size, -size % _BLOCK
            if not size:
                self._close_file()

    def _close_file(self) -> None:
        assert self.fd is not None and self.current is not None
        os.fchmod(self.fd, self.current.mode)
        os.close(self.fd)
        self.fd = None
        if self.hashed.hexdigest() != self.current.sha256:
            raise self._bad(f"{self.current.path} does not hash to its listed SHA-256")

    def _missing(self) -> bool:
        missing = sorted(set(self.expected) - self.seen)
        raise self._bad(f"the archive ends without {', '.join(missing[:5])}")

    def finish(self) -> None:
        """After the last chunk: the gzip stream and the archive ended, nothing is missing;
        directories get their listed modes. Raises ArtifactInvalid."""
        if not self.inflate.eof or not self.ended or self.left or self.buffer:
            raise self._bad("the layer ends early")
        # Belt and braces beside check_entries' resolver: every placed link, resolved by the
        # kernel's own rules, stays in the tree before anything writes through it.
        root = os.path.realpath(self.dest)
        for path, entry in self.expected.items():
            if entry.kind == LINK:
                real = os.path.realpath(self.dest / path)
                if os.path.commonpath([root, real]) != root:
                    raise self._bad(f"the link {path!r} -> {entry.target!r} leaves the tree")
        for path in sorted(self.made - {""}, key=len, reverse=True):
            os.chmod(self.dest / path, self.expected[path].mode)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
