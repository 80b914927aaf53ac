"""HostRoot: maps paths as the host sees them to local paths under the mounted host root."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import NamedTuple, Union

from installer import safefs
from installer.errors import HostLayoutError

HostPath = Union[str, PurePosixPath]

_MAX_SYMLINK_HOPS = 40

# How each host tool is pointed at a host root that is not `/`: its own flag, or chroot for a
# tool that has none (dkms builds with the host's compiler and kernel-devel, so it runs inside).
_ROOT_FLAGS: dict[str, Callable[[str], list[str]]] = {
    "ldconfig": lambda root: ["-r", root],
    "depmod": lambda root: ["-b", root],
    "modprobe": lambda root: ["-d", root],
    "rpm": lambda root: ["--root", root],
    "dnf": lambda root: [f"--installroot={root}"],
}
_CHROOTED = frozenset({"dkms"})
# What pathlib's is_symlink takes for "no link there" rather than an error.
_NOT_THERE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def _is_symlink(path: str) -> bool:
    """Path(path).is_symlink(), without making a Path."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError as error:
        if error.errno not in _NOT_THERE:
            raise
        return False
    except ValueError:  # a NUL in the name
        return False


class HostRoot(NamedTuple):
    """The host's `/` as this process sees it (`/` on a bare host, `/root` in the DaemonSet).

    Host paths are absolute POSIX paths as the host sees them; local paths are what this
    process opens. Only this class joins the two.
    """

    root: Path

    @property
    def is_bare(self) -> bool:
        return str(self.root) == "/"

    def local(self, host_path: HostPath) -> Path:
        """The local path of `host_path`, without resolving symlinks."""
        path = PurePosixPath(host_path)
        if not path.is_absolute():
            raise ValueError(f"host path must be absolute: {host_path}")
        parts = [p for p in path.parts[1:] if p not in ("", ".")]
        if ".." in parts:
            raise ValueError(f"host path must not contain '..': {host_path}")
        return self.root.joinpath(*parts)

    def host_path(self, local_path: Path) -> PurePosixPath:
        """The host's view of a local path that lies under the root."""
        try:
            rel = Path(os.path.abspath(local_path)).relative_to(os.path.abspath(self.root))
        except ValueError as exc:
            raise HostLayoutError(f"{local_path} is not under the host root {self.root}") from exc
        return PurePosixPath("/") / PurePosixPath(rel.as_posix())

    def resolve(self, host_path: HostPath) -> PurePosixPath:
        """Resolve symlinks as the host would: absolute link targets stay inside the root."""
        pending = list(PurePosixPath(host_path).parts[1:])
        pending.reverse()
        # The resolved names below /, joined as strings: a run resolves some 30 host paths,
        # and pathlib objects per component cost it 3 ms.
        resolved: list[str] = []
        root = str(self.root)
        hops = 0
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            local = os.path.join(root, *resolved, part)
            if _is_symlink(local):
                hops += 1
                if hops > _MAX_SYMLINK_HOPS:
                    raise HostLayoutError(f"too many levels of symbolic links in {host_path}")
                target = PurePosixPath(os.readlink(local))
                if target.is_absolute():
                    resolved = []
                pending.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
                continue
            resolved.append(part)
        return PurePosixPath("/", *resolved)

    def tool_argv(self, tool: str, *args: str) -> list[str]:
        """`tool args...` acting on the host: as it is on a bare host, else with the tool's
        root flag first (`ldconfig -r <root>`, `rpm --root <root>`, ...) or under chroot.
        Raises KeyError for a tool whose way into a root is not known here."""
        if self.is_bare:
            return [tool, *args]
        if tool in _CHROOTED:
            return ["chroot", str(self.root), tool, *args]
        return [tool, *_ROOT_FLAGS[tool](str(self.root)), *args]

    def local_resolved(self, host_path: HostPath) -> Path:
        return self.local(self.resolve(host_path))

    def files_in(self, directory: HostPath, suffixes: tuple[str, ...]) -> list[PurePosixPath]:
        """The regular files in host `directory` whose names end in one of `suffixes`, as host
        paths in name order (the order apt, dnf and zypper read their source files in)."""
        local = self.local_resolved(directory)
        if not local.is_dir():
            return []
        return [PurePosixPath(directory) / p.name for p in sorted(local.iterdir())
                if p.suffix in suffixes and p.is_file()]

    def exists(self, host_path: HostPath) -> bool:
        return self.local_resolved(host_path).exists()

    def read_text(self, host_path: HostPath, default: str | None = None) -> str | None:
        try:
            return self.local_resolved(host_path).read_text(errors="replace")
        except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
            return default

    def write_atomic(self, host_path: HostPath, data: str | bytes, mode: int = 0o644) -> Path:
        """Write a host file so readers see the old or the new content, never a mix. The
        directory is found as the host finds it (its links are the host's: /var/run -> /run);
        a link at the file's own name is refused with PlantedLink, never replaced or written
        through: the readiness files sit in a directory other pods mount. To rewrite a host's
        own file that may be a link (/etc/ld.so.conf), pass `self.resolve(path)`."""
        path = PurePosixPath(host_path)
        return write_atomic(self.local_resolved(path.parent) / path.name, data, mode)


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> Path:
    """Write `path` through a new temp file in the same dir, fsync, then rename over it; the
    directory is made when missing. A link at `path` is refused (PlantedLink): records and
    readiness files live where other pods can write."""
    return safefs.write_atomic(path, data, mode)
