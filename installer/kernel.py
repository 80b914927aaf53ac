"""Kernel header trees: find them on the host, in the image or the cache; make them visible."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer import distros
from installer.errors import KernelHeadersMissing
from installer.hostroot import HostRoot


@dataclass(frozen=True)
class Headers:
    """A header tree: where the host has it, and the trees that must be visible at their own
    absolute paths for kbuild to work (Debian's Makefile includes `-common` by absolute path)."""

    host_path: PurePosixPath
    binds: tuple[PurePosixPath, ...]
    in_container: bool = False
    # Where the trees lie here when they are not the host root's (headers unpacked into the
    # install dir's cache): `binds` are then taken from below this directory.
    unpacked_root: Path | None = None


def candidate_paths(kernel: str) -> tuple[PurePosixPath, ...]:
    return (
        PurePosixPath(f"/lib/modules/{kernel}/build"),
        PurePosixPath(f"/usr/src/kernels/{kernel}"),
        PurePosixPath(f"/usr/src/linux-headers-{kernel}"),
    )


def headers_package(family: str, kernel: str) -> str:
    return distros.named(family).headers_package(kernel)


def find_headers(root: HostRoot, kernel: str) -> Headers | None:
    """The host's header tree for `kernel`, or None. Reads only."""
    for candidate in candidate_paths(kernel):
        resolved = root.resolve(candidate)
        local = root.local(resolved)
        if (local / "Makefile").is_file() and (local / "include").is_dir():
            return Headers(resolved, _trees_to_bind(root, resolved))
    return None


def find_unpacked_headers(tree_root: Path, kernel: str) -> Headers | None:
    """Headers unpacked from packages under `tree_root` (a root-shaped directory)."""
    found = find_headers(HostRoot(tree_root), kernel)
    if found is None:
        return None
    return Headers(found.host_path, found.binds, unpacked_root=tree_root)


def find_container_headers(kernel: str) -> Headers | None:
    """Headers installed inside the installer's own image (already at their own paths)."""
    bare = HostRoot(Path("/"))
    found = find_headers(bare, kernel)
    return Headers(found.host_path, (), in_container=True) if found else None


def _trees_to_bind(root: HostRoot, headers: PurePosixPath) -> tuple[PurePosixPath, ...]:
    """`/usr/src` plus every top-level tree that links of the header dir point into."""
    trees = {PurePosixPath("/usr/src")}
    if not str(headers).startswith("/usr/src/"):
        trees.add(PurePosixPath(*headers.parts[:4]))
    local = root.local(headers)
    for entry in local.iterdir():
        if entry.is_symlink():
            target = root.resolve(headers / entry.name)
            if not str(target).startswith("/usr/src/"):
                trees.add(PurePosixPath(*target.parts[:4]))
    return tuple(sorted(trees, key=str))


def with_host_trees(root: HostRoot, headers: Headers, argv: list[str]) -> list[str]:
    """Wrap `argv` so it runs in a private mount namespace with the host's header trees
    bind-mounted at their own absolute paths (nothing changes outside that namespace)."""
    if headers.unpacked_root is not None:
        root = HostRoot(headers.unpacked_root)
    if root.is_bare or headers.in_container or not headers.binds:
        return argv
    script = ["set -e"]
    args: list[str] = []
    for index, tree in enumerate(headers.binds):
        src, dst = 1 + 2 * index, 2 + 2 * index
        script.append(f'mkdir -p "${{{dst}}}" && mount --bind "${{{src}}}" "${{{dst}}}"')
        args += [str(root.local(tree)), str(tree)]
    script.append(f"shift {len(args)}")
    script.append('exec "$@"')
    return [
        "unshare", "--mount", "--propagation", "private", "--",
        "sh", "-c", "; ".join(script), "sh", *args, *argv,
    ]


def missing_headers_error(kernel: str, family: str, tried: str = "") -> KernelHeadersMissing:
    """kernel-headers-missing naming the package, the kernel and every place looked at."""
    package = headers_package(family, kernel)
    where = ", ".join(str(p) for p in candidate_paths(kernel))
    message = f"no kernel headers for kernel {kernel}: looked in {where} on the host"
    if tried:
        message += f"; {package}: {tried}"
    return KernelHeadersMissing(
        message,
        hint=f"Install {package} on the host (it must match the kernel exactly), configure a "
        "package source that has it, or set NVIDIA_INSTALLER_HEADERS_MIRROR to a mirror of the "
        "host's package archive.",
    )
