"""Modules for another architecture's kernel (an x86 builder making arm64 modules): NVIDIA's own
Makefile driven with the cross toolchain, since the target's nvidia-installer cannot run here."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import NamedTuple

from installer.errors import (
    CommandFailed,
    CrossBuildUnsupported,
    CrossCompilerMissing,
    HeadersWrongArch,
    KbuildToolsWrongArch,
    ModuleBuildFailed,
)
from installer.headers import steps, trees
from installer.plan import Context

log = logging.getLogger(__name__)


class ArchTools(NamedTuple):
    """How the kernel and the GNU toolchain name one architecture."""

    kernel_arch: str  # ARCH= for kbuild and NVIDIA's Makefile
    triplet: str  # the cross toolchain's prefix, without the dash
    elf_machine: int  # e_machine of its ELF files
    config_symbol: str  # set in a kernel .config built for it


ARCHES = {
    "x86_64": ArchTools("x86_64", "x86_64-linux-gnu", 62, "CONFIG_X86_64"),
    "aarch64": ArchTools("arm64", "aarch64-linux-gnu", 183, "CONFIG_ARM64"),
}
# The optional module a modules-only build leaves out, as nvidia-installer does with --no-drm.
EXCLUDED_MODULES = ("nvidia-drm",)
# What kbuild runs on the builder while compiling a module: it must be the builder's own program.
KBUILD_HOST_TOOL = "scripts/basic/fixdep"


def builder_arch() -> str:
    from installer import host

    return host.normalise_arch()


def is_cross(ctx: Context) -> bool:
    """The planned architecture is not this machine's: only `installer prebuild --arch` plans
    so (a node always plans for itself)."""
    return ctx.facts.arch != builder_arch()


def elf_machine(path: Path) -> int | None:
    """e_machine of an ELF file (little-endian: both architectures here are), or None."""
    try:
        with path.open("rb") as handle:
            head = handle.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] != 1:
        return None
    return int.from_bytes(head[18:20], "little")


def check_headers(output_tree: Path, arch: str, kernel_release: str) -> None:
    """HeadersWrongArch unless the configured tree's .config was made for `arch`."""
    tools = ARCHES[arch]
    for name in (".config", "include/config/auto.conf"):
        try:
            text = (output_tree / name).read_text(errors="replace")
        except OSError:
            continue
        if re.search(rf"(?m)^{tools.config_symbol}=y$", text):
            return
        other = [a for a, t in ARCHES.items() if re.search(rf"(?m)^{t.config_symbol}=y$", text)]
        raise HeadersWrongArch(
            f"the headers of kernel {kernel_release} ({output_tree}) are configured for "
            f"{other[0] if other else 'another architecture'}, not {arch} ({tools.config_symbol} "
            f"is not set in its {name})")
    raise HeadersWrongArch(
        f"the headers of kernel {kernel_release} ({output_tree}) have no .config: their "
        f"architecture cannot be told, and a cross build for {arch} needs it")


def check_kbuild_tools(output_tree: Path, kernel_release: str) -> None:
    """KbuildToolsWrongArch when the headers' kbuild programs are not this machine's: Debian's
    arm64 headers come with arm64 `linux-kbuild` programs, which an x86 builder cannot run."""
    tool = output_tree / KBUILD_HOST_TOOL
    machine = elf_machine(tool)
    mine = ARCHES[builder_arch()]
    if machine is None or machine == mine.elf_machine:
        return  # absent or a script: the build itself says what is wrong
    named = next((a for a, t in ARCHES.items() if t.elf_machine == machine), f"machine {machine}")
    raise KbuildToolsWrongArch(
        f"{tool} (kernel {kernel_release}'s kbuild) is a {named} program, and this builder is "
        f"{builder_arch()}: make cannot run it")


def cross_compiler(ctx: Context, arch: str, major: int | None) -> dict[str, str]:
    """The make variables that select the cross toolchain for `arch`: ARCH, CROSS_COMPILE, and
    CC of the kernel's gcc major (NVIDIA's Makefile would otherwise take the builder's own gcc
    from the kernel's CONFIG_CC_VERSION_TEXT). Raises CrossCompilerMissing."""
    tools = ARCHES[arch]
    prefix = f"{tools.triplet}-"
    candidates = [f"{prefix}gcc-{major}"] if major is not None else []
    candidates.append(f"{prefix}gcc")
    for compiler in candidates:
        if shutil.which(compiler) is None:
            continue
        if compiler.endswith(f"-{major}") or major is None:
            return _variables(tools, compiler)
        said = ctx.runner.run([compiler, "-dumpversion"], check=False, timeout=60).output
        if said.strip().split(".")[0] == str(major):
            return _variables(tools, compiler)
    wanted = candidates[0]
    raise CrossCompilerMissing(
        f"building {arch} modules on this {builder_arch()} builder needs the cross compiler "
        f"{wanted} (kernel {ctx.target.kernel} was built with gcc {major or 'of unknown major'})"
        f": not found in PATH")


def _variables(tools: ArchTools, compiler: str) -> dict[str, str]:
    prefix = f"{tools.triplet}-"
    return {"ARCH": tools.kernel_arch, "CROSS_COMPILE": prefix, "CC": compiler,
            "LD": f"{prefix}ld"}


def make_argv(tree: Path, source: str, output: str, variables: dict[str, str],
              jobs: int = 0) -> list[str]:
    """NVIDIA's Makefile as nvidia-installer runs it (`make SYSSRC= SYSOUT= modules`), with the
    cross toolchain's variables on the command line, where they override the kernel's."""
    jobs = jobs or min(os.cpu_count() or 1, 32)
    return [
        "make", "-C", str(tree), f"-j{jobs}",
        "NV_EXCLUDE_KERNEL_MODULES=" + " ".join(EXCLUDED_MODULES),
        f"SYSSRC={source}", f"SYSOUT={output}",
        *(f"{name}={value}" for name, value in sorted(variables.items())),
        "modules",
    ]


def build(ctx: Context, staging: Path, tmp: Path) -> None:
    """Compile the planned flavour's modules for `ctx.facts.arch` into `staging` (a copy of the
    extracted tree is built in `tmp`; the extracted .run stays clean). Raises
    CrossBuildUnsupported, CrossCompilerMissing, HeadersWrongArch, KbuildToolsWrongArch and
    ModuleBuildFailed; changes nothing on the host."""
    t, arch = ctx.target, ctx.facts.arch
    assert t.headers is not None
    if arch not in ARCHES:
        raise CrossBuildUnsupported(f"no cross toolchain is known for {arch}")
    if ctx.config.signing_key or ctx.config.signing_cert:
        raise CrossBuildUnsupported(
            f"signing modules for Secure Boot is not done in a cross build for {arch} "
            "(NVIDIA_MODULE_SIGNING_KEY / NVIDIA_MODULE_SIGNING_CERT are set)")
    output_local = steps.local_tree(ctx, t.headers)
    check_headers(output_local, arch, t.kernel)
    check_kbuild_tools(output_local, t.kernel)
    major, _ = steps.kernel_gcc(ctx)
    variables = cross_compiler(ctx, arch, major)
    flavour_dir = "kernel-open" if t.flavour == "open" else "kernel"
    tree = tmp / flavour_dir
    shutil.copytree(ctx.layout.extracted(t.version) / flavour_dir, tree, symlinks=True)
    log.info("cross-building %s modules for %s kernel %s with %s on this %s builder", t.flavour,
             arch, t.kernel, variables["CC"], builder_arch())
    argv = make_argv(tree, str(t.headers.source_path), str(t.headers.output_path), variables)
    try:
        ctx.runner.run(trees.with_host_trees(ctx.root, t.headers, argv), stream=True,
                       timeout=3600)
    except CommandFailed as exc:
        raise ModuleBuildFailed(
            f"cross-building the {t.flavour} kernel modules of {t.version} for {arch} kernel "
            f"{t.kernel} failed (exit {exc.returncode}):\n{exc.output_tail}") from exc
    for ko in sorted(tree.glob("*.ko")):
        if elf_machine(ko) != ARCHES[arch].elf_machine:
            raise ModuleBuildFailed(f"the cross build left {ko.name}, which is not an {arch} "
                                    "ELF object")
        shutil.copy2(ko, staging / ko.name)
