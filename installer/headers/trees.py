"""Kernel header trees: find them on the host, in the image or the cache; make them visible."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from installer import distros
from installer.errors import KernelHeadersMissing
from installer.hostroot import HostRoot
from installer.plan import Headers  # the value plan.Context carries, defined beside it

# nvidia-installer's checks (kernel.c): the source tree has include/linux/kernel.h, the output
# tree (the configured build tree) has one of these.
SOURCE_MARKER = "include/linux/kernel.h"
OUTPUT_MARKERS = ("include/generated/uapi/linux/version.h", "include/linux/version.h")

# The installer's own image: its header trees sit at their own paths (images/ install some).
# A name of its own so that tests pose the image's trees rather than inherit the test machine's.
IMAGE_ROOT = Path("/")


def candidate_paths(kernel: str) -> tuple[PurePosixPath, ...]:
    return (
        PurePosixPath(f"/lib/modules/{kernel}/build"),
        PurePosixPath(f"/usr/src/kernels/{kernel}"),
        PurePosixPath(f"/usr/src/linux-headers-{kernel}"),
    )


def headers_package(family: str, kernel: str) -> str:
    return distros.named(family).headers_package(kernel)


def find_headers(root: HostRoot, kernel: str) -> Headers | None:
    """The host's header trees for `kernel`, or None. Reads only."""
    for candidate in candidate_paths(kernel):
        output = root.resolve(candidate)
        local = root.local(output)
        if not ((local / "Makefile").is_file() and _has_any(root, output, OUTPUT_MARKERS)):
            continue
        found = _source_tree(root, kernel, output)
        if found is None:
            continue
        source, source_why = found
        output_why = (f"the configured tree ({candidate}; it has "
                      f"{_first(root, output, OUTPUT_MARKERS)})")
        return Headers(output, source, _trees_to_bind(root, (output, source)),
                       output_why=output_why, source_why=source_why)
    return None


def _source_tree(root: HostRoot, kernel: str, output: PurePosixPath
                 ) -> tuple[PurePosixPath, str] | None:
    """The tree with include/linux/kernel.h that belongs to `output`: `output` itself (RHEL's
    kernel-devel, Ubuntu's flavour tree linking the common one in, a full build tree), else
    /lib/modules/<k>/source (Debian's `-common`), `<output>/source` (a kbuild O= tree), or the
    tree the output's Makefile includes (Debian's `-amd64` Makefile includes `-common`'s)."""
    if _has_any(root, output, (SOURCE_MARKER,)):
        return output, f"the same tree (it has {SOURCE_MARKER})"
    candidates = [
        (PurePosixPath(f"/lib/modules/{kernel}/source"), f"/lib/modules/{kernel}/source"),
        (output / "source", f"{output}/source"),
    ]
    included = _included_makefile_dir(root, output)
    if included is not None:
        candidates.append((included, f"the tree {output}/Makefile includes"))
    for path, how in candidates:
        resolved = root.resolve(path)
        if resolved != output and _has_any(root, resolved, (SOURCE_MARKER,)):
            return resolved, f"{how} (it has {SOURCE_MARKER}; Debian's split headers)"
    return None


def _included_makefile_dir(root: HostRoot, tree: PurePosixPath) -> PurePosixPath | None:
    text = root.read_text(tree / "Makefile", default="") or ""
    for line in text.splitlines()[:5]:
        words = line.split()
        if len(words) == 2 and words[0] == "include" and words[1].startswith("/") \
                and words[1].endswith("/Makefile"):
            return PurePosixPath(words[1]).parent
    return None


def _has_any(root: HostRoot, tree: PurePosixPath, markers: tuple[str, ...]) -> bool:
    return _first(root, tree, markers) is not None


def _first(root: HostRoot, tree: PurePosixPath, markers: tuple[str, ...]) -> str | None:
    for marker in markers:
        if root.local_resolved(tree / marker).is_file():
            return marker
    return None


def find_unpacked_headers(tree_root: Path, kernel: str) -> Headers | None:
    """Headers unpacked from packages under `tree_root` (a root-shaped directory)."""
    found = find_headers(HostRoot(tree_root), kernel)
    if found is None:
        return None
    return found._replace(unpacked_root=tree_root)


def find_container_headers(kernel: str) -> Headers | None:
    """Headers installed inside the installer's own image (already at their own paths)."""
    found = find_headers(HostRoot(IMAGE_ROOT), kernel)
    return found._replace(binds=(), in_container=True) if found else None


def _trees_to_bind(root: HostRoot, trees: tuple[PurePosixPath, ...]
                   ) -> tuple[PurePosixPath, ...]:
    """`/usr/src` plus every top-level tree the header trees or their links point into."""
    binds = {PurePosixPath("/usr/src")}
    for tree in trees:
        if not str(tree).startswith("/usr/src/"):
            binds.add(PurePosixPath(*tree.parts[:4]))
        for entry in root.local(tree).iterdir():
            if entry.is_symlink():
                target = root.resolve(tree / entry.name)
                if not str(target).startswith("/usr/src/"):
                    binds.add(PurePosixPath(*target.parts[:4]))
    return tuple(sorted(binds, key=str))


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
