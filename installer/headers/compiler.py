"""The compiler for module builds: the kernel's gcc major, the image's gcc, the tag that has it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import NamedTuple

from installer import distros
from installer.errors import CompilerInstallFailed, CompilerMissing
from installer.runner import Runner

# Red Hat's gcc-toolset-N packages install gcc-N under /opt/rh/gcc-toolset-N/root.
TOOLSETS = Path("/opt/rh")

_GCC_IN_PROC_VERSION = r"gcc[^)]*?\)?\s*(?:version\s+)?(\d+)\.(\d+)(?:\.\d+)?"
_GCC_VERSION_CONFIG = r"(?m)CONFIG_GCC_VERSION=(\d+)$"

# The installer's image tags and the gcc majors each carries (images/ builds them).
IMAGE_COMPILERS: dict[str, tuple[int, ...]] = distros.image_compilers()


def kernel_gcc_major(proc_version: str | None) -> int | None:
    """The gcc major the kernel was built with, from /proc/version."""
    if not proc_version:
        return None
    match = re.search(_GCC_IN_PROC_VERSION, proc_version)
    return int(match.group(1)) if match else None


def headers_gcc_major(tree: Path) -> int | None:
    """The gcc major recorded in a header tree's config (`CONFIG_GCC_VERSION=120200`)."""
    for name in ("include/config/auto.conf", ".config"):
        try:
            text = (tree / name).read_text(errors="replace")
        except OSError:
            continue
        for match in re.finditer(_GCC_VERSION_CONFIG, text):
            # Its own line (a line start checked here, not by `^`: a search led by the literal
            # is 6x faster over a 150 kB auto.conf, on every run).
            if match.start() == 0 or text[match.start() - 1] == "\n":
                return int(match.group(1)) // 10000
    return None


def tags_with(major: int) -> list[str]:
    return [tag for tag, majors in IMAGE_COMPILERS.items() if major in majors]


class Compiler(NamedTuple):
    """The gcc a build uses: `env` selects it (CC=gcc-N), `note` says why."""

    env: dict[str, str]
    note: str


class Installable(NamedTuple):
    """A gcc the image's package sources offer: `package` puts the compiler at `path`."""

    major: int
    package: str
    path: str

    @property
    def family(self) -> distros.Family:
        """The family whose image installs `package`; CompilerInstallFailed for none."""
        found = distros.for_compiler_package(self.package)
        if found is None:
            raise CompilerInstallFailed(
                f"no distro family installs the compiler package {self.package!r}",
                hint="The image's compiler list names a package neither its apt-get nor its dnf "
                "installs: rebuild the image with images/build.sh.")
        return found

    @property
    def manager(self) -> str:
        return self.family.image_tool

    def install_argvs(self) -> list[list[str]]:
        return self.family.compiler_install_argvs(self.package)

    def describe(self) -> str:
        return (f"{self.package} from the image's package sources ({self.manager} in the "
                "container before the driver download; the host is not touched)")


def installable(major: int | None, sources: Path | None) -> Installable | None:
    """The package of the image's sources that carries gcc `major`, per the `sources` list
    (config.compiler_packages: `<major> <package> <gcc path>` a line, written by the images'
    build while their package lists are present). Absent outside our images: an installer run
    on a host never installs a compiler."""
    if major is None or sources is None:
        return None
    try:
        text = sources.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        # A package no family installs is not offered (compiler-missing names the tag to use).
        if (len(fields) == 3 and fields[0] == str(major)
                and distros.for_compiler_package(fields[1]) is not None):
            return Installable(major, fields[1], fields[2])
    return None


def image_default_major(runner: Runner) -> int | None:
    result = runner.run(["gcc", "-dumpversion"], check=False)
    found = result.output.strip().split(".")[0]
    return int(found) if result.ok and found.isdigit() else None


def choose(runner: Runner, kernel_major: int | None) -> Compiler | None:
    """A gcc of the image matching `kernel_major`; None when the image has none. Reads only."""
    versioned = f"gcc-{kernel_major}"
    if kernel_major is not None and shutil.which(versioned):
        return Compiler({"CC": versioned}, f"{versioned} from the image (the kernel's gcc)")
    toolset = TOOLSETS / f"gcc-toolset-{kernel_major}/root/usr/bin/gcc"
    if kernel_major is not None and toolset.is_file():
        return Compiler({"CC": str(toolset)}, f"gcc-toolset-{kernel_major} from the image "
                        "(the kernel's gcc)")
    ours = image_default_major(runner) if shutil.which("gcc") else None
    if kernel_major is None:
        return Compiler({}, f"gcc {ours} from the image (the kernel's gcc is unknown)")
    if ours == kernel_major:
        return Compiler({}, f"gcc {ours} from the image (the kernel's gcc)")
    return None


def install(runner: Runner, package: Installable, kernel: str) -> None:
    """Installs the kernel's gcc with the image's package manager (in the container)."""
    for argv in package.install_argvs():
        result = runner.run(argv, check=False, timeout=900)
        if not result.ok:
            tags = tags_with(package.major)
            raise CompilerInstallFailed(
                f"kernel {kernel} needs gcc {package.major}; `{' '.join(argv)}` failed "
                f"(exit {result.returncode}): {result.tail(8)}",
                hint=f"Compiler gcc-{package.major} ({package.package}): check the node's route "
                f"to the image's package sources, or use the installer image tag "
                f"{' or '.join(tags) or '(none carries it; build one)'}.",
            )


def missing_error(kernel: str, kernel_major: int, source: str, runner: Runner) -> CompilerMissing:
    """compiler-missing naming the compiler and the image tags that carry it."""
    ours = image_default_major(runner) if shutil.which("gcc") else None
    tags = tags_with(kernel_major)
    use = (f"use the installer image tag {' or '.join(tags)}, which carries gcc-{kernel_major}"
           if tags else f"no installer image carries gcc-{kernel_major}; build one that does")
    return CompilerMissing(
        f"kernel {kernel} was built with gcc {kernel_major} ({source}) and this image has "
        f"{'gcc ' + str(ours) if ours else 'no gcc'} and no gcc-{kernel_major}: modules built "
        "with another compiler major fail to build or load",
        hint=f"Compiler gcc-{kernel_major}: {use}.",
    )
