"""Kernel headers for the target kernel: find them, make them usable here, match the compiler."""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer.errors import CommandFailed, KernelHeadersMissing
from installer.hostroot import HostRoot
from installer.runner import Runner

log = logging.getLogger(__name__)

_GCC_IN_PROC_VERSION = re.compile(r"gcc[^)]*?\)?\s*(?:version\s+)?(\d+)\.(\d+)(?:\.\d+)?")


@dataclass(frozen=True)
class Headers:
    """A header tree: where the host has it, and the trees that must be visible at their own
    absolute paths for kbuild to work (Debian's Makefile includes `-common` by absolute path)."""

    host_path: PurePosixPath
    binds: tuple[PurePosixPath, ...]
    in_container: bool = False


def candidate_paths(kernel: str) -> tuple[PurePosixPath, ...]:
    return (
        PurePosixPath(f"/lib/modules/{kernel}/build"),
        PurePosixPath(f"/usr/src/kernels/{kernel}"),
        PurePosixPath(f"/usr/src/linux-headers-{kernel}"),
    )


def headers_package(family: str, kernel: str) -> str:
    return f"kernel-devel-{kernel}" if family == "rhel" else f"linux-headers-{kernel}"


def find_headers(root: HostRoot, kernel: str) -> Headers | None:
    """The host's header tree for `kernel`, or None. Reads only."""
    for candidate in candidate_paths(kernel):
        resolved = root.resolve(candidate)
        local = root.local(resolved)
        if (local / "Makefile").is_file() and (local / "include").is_dir():
            return Headers(resolved, _trees_to_bind(root, resolved))
    return None


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


def install_headers(runner: Runner, package_manager: str, family: str, kernel: str) -> Headers:
    """Install the exact headers package inside the image; KernelHeadersMissing if it can't."""
    package = headers_package(family, kernel)
    if package_manager == "apt":
        commands = [["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends",
                                           package]]
    else:
        commands = [["dnf", "install", "-y", package]]
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        for argv in commands:
            runner.run(argv, env=env, stream=True, timeout=900)
    except CommandFailed as exc:
        raise missing_headers_error(kernel, family, tried=f"`{' '.join(exc.argv)}` failed:\n"
                                    + exc.output_tail) from exc
    found = find_container_headers(kernel)
    if found is None:
        raise missing_headers_error(kernel, family, tried=f"{package} installed but no tree found")
    return found


def missing_headers_error(kernel: str, family: str, tried: str = "") -> KernelHeadersMissing:
    package = headers_package(family, kernel)
    where = ", ".join(str(p) for p in candidate_paths(kernel))
    message = f"no kernel headers for kernel {kernel} (looked in {where} on the host)"
    if tried:
        message += f"; installing {package} in the image: {tried}"
    return KernelHeadersMissing(
        message,
        hint=f"Install {package} on the host (it must match the running kernel exactly), "
        "or let the installer fetch it: NVIDIA_INSTALLER_FETCH_HEADERS=true.",
    )


def kernel_gcc_major(proc_version: str | None) -> int | None:
    """The gcc major the kernel was built with, from /proc/version."""
    if not proc_version:
        return None
    match = _GCC_IN_PROC_VERSION.search(proc_version)
    return int(match.group(1)) if match else None


def matching_compiler(runner: Runner, kernel_major: int | None) -> tuple[dict[str, str], str]:
    """Environment that selects a gcc matching the kernel's, and a note for the log."""
    result = runner.run(["gcc", "-dumpversion"], check=False)
    found = result.output.strip().split(".")[0]
    ours = int(found) if found.isdigit() else None
    if kernel_major is None or ours == kernel_major:
        return {}, f"gcc {ours} (kernel built with gcc {kernel_major})"
    versioned = f"gcc-{kernel_major}"
    if shutil.which(versioned):
        return {"CC": versioned}, f"using {versioned} to match the kernel (default gcc is {ours})"
    log.warning(
        "compiler mismatch: the kernel was built with gcc %s but this image has gcc %s; "
        "the module build may fail (install gcc-%s in the image)", kernel_major, ours, kernel_major,
    )
    return {}, f"gcc {ours} differs from the kernel's gcc {kernel_major}"
