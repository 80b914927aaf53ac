"""NVIDIA's `.run` as steps: fetch it, extract it once, build the modules, install the user
space and its firmware (its argv in `argv.py`, its identity checks in
`identity.py`)."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import installer.headers.steps
from installer import safefs
from installer.components import gpudirect
from installer.dirs import mark_complete, remove_tree, scratch, staged_dir
from installer.errors import CommandFailed, InstallFailed, ModuleBuildFailed, RunfileMismatch
from installer.headers import trees as header_trees
from installer.layout import Layout
from installer.plan import Context, Step
from installer.release import download
from installer.sources.installed import (
    EXTRACTED_MARKER,
    extracted_marker,
    is_extracted,
    module_version_matches,
    modules_built,
    userspace_installed,
    write_listing,
)
from installer.sources.runfile import cross
from installer.sources.runfile.argv import (
    BuildRequest,
    build_modules_argv,
    extract_argv,
    install_userspace_argv,
)
from installer.sources.runfile.identity import (
    archive_problems,
    header_identity,
    manifest_problems,
    tree_problems,
)

log = logging.getLogger(__name__)




def _runfile_needed(ctx: Context) -> bool:
    return not (modules_built(ctx) and userspace_installed(ctx))


def drop_cached_runfile(layout: Layout, name: str) -> None:
    """Forget a .run that failed extraction or identification: the file, its sidecars, and
    any tree extracted from it, so no later run reuses them."""
    if layout.downloads.is_dir():
        for path in layout.downloads.iterdir():
            if path.name.startswith(name):
                remove_tree(path)
    log.info("dropped %s from the cache", name)


def fetch_step(ctx: Context) -> Step:
    name = download.runfile_name(ctx.target.version, ctx.facts.arch)

    def satisfied() -> bool:
        return (
            not _runfile_needed(ctx)
            or is_extracted(ctx.layout.extracted(ctx.target.version), ctx.target.version)
            or download.cached_runfile(ctx.config, ctx.layout.downloads, name)
        )

    def apply() -> None:
        ctx.runfile = ctx.fetch_runfile(ctx.target.urls, ctx.layout.downloads, name)

    return Step("fetch-runfile", f"download {name} (retries, resume, a SHA-256 from the pin, "
                "the digests file or a trusted origin, cache)",
                satisfied, apply)


def extract_step(ctx: Context) -> Step:
    t, layout = ctx.target, ctx.layout
    directory = layout.extracted(t.version)
    name = download.runfile_name(t.version, ctx.facts.arch)

    def satisfied() -> bool:
        return not _runfile_needed(ctx) or is_extracted(directory, t.version)

    def refuse(runfile: Path, problems: list[str]) -> RunfileMismatch:
        remove_tree(directory)
        drop_cached_runfile(layout, name)
        return RunfileMismatch(
            f"{runfile.name} is not the {ctx.facts.arch} driver {t.version} that was planned: "
            + "; ".join(problems))

    def apply() -> None:
        from installer.delivery import file_sha256

        runfile = ctx.runfile or layout.downloads / name
        remove_tree(directory)
        with staged_dir(directory, create=False, within=layout.anchor_for(directory)) as staging:
            # Read as text, never run: only a .run that names the planned version and arch
            # in its makeself header is executed (its digest was verified when fetched).
            problems = archive_problems(header_identity(runfile), t.version, ctx.facts.arch)
            if problems:
                raise refuse(runfile, problems)
            with scratch(layout.tmp, within=layout.cache_anchor) as tmp:
                try:
                    ctx.runner.run(extract_argv(runfile, staging, tmp), timeout=600)
                except CommandFailed as exc:
                    drop_cached_runfile(layout, name)
                    raise InstallFailed(
                        f"extracting {runfile.name} failed: {exc.output_tail}",
                        hint="The file was damaged and is removed from the cache: run again to "
                        "download it anew.") from exc
            if cross.is_cross(ctx):
                # The target's nvidia-installer cannot run on this builder: its manifest says.
                problems = manifest_problems(staging, t.version)
            else:
                said = ctx.runner.run([str(staging / "nvidia-installer"), "--version"],
                                      check=False, timeout=120)
                problems = tree_problems(staging, said.output, t.version)
            if problems:
                raise refuse(runfile, problems)
            # The marker names the .run's digest: a later run reuses only trees this installer
            # extracted from a .run its rules vouched for (an older one's marker lacks it).
            mark_complete(staging, extracted_marker(t.version, file_sha256(runfile)),
                          EXTRACTED_MARKER)
        log.info("extracted %s (version %s, %s, as planned)", runfile.name, t.version,
                 ctx.facts.arch)

    return Step("extract-runfile", "identify the .run as the planned version, extract it once "
                "into the cache", satisfied, apply)


def headers_step(ctx: Context) -> Step:
    # Its own step of the same name wraps this one: named in full.
    return installer.headers.steps.headers_step(ctx, lambda: modules_built(ctx))


def compiler_step(ctx: Context) -> Step:
    return installer.headers.steps.compiler_step(ctx, lambda: modules_built(ctx))


def build_step(ctx: Context) -> Step:
    t, layout = ctx.target, ctx.layout
    final = layout.module_build(t.version, t.kernel, t.flavour)

    def satisfied() -> bool:
        return modules_built(ctx)

    def apply() -> None:
        assert t.headers is not None
        if cross.is_cross(ctx):
            with staged_dir(final, within=layout.anchor_for(final)) as staging, \
                    scratch(layout.tmp, within=layout.cache_anchor) as tmp:
                cross.build(ctx, staging, tmp)
                _check_built(staging, t.version)
                mark_complete(staging, f"{t.version} {t.kernel} {t.flavour}\n")
            log.info("built %s", ", ".join(p.name for p in sorted(final.glob("*.ko"))))
            return
        log_file = layout.install_local / "nvidia-installer-build.log"
        # nvidia-installer opens its log with fopen("w"): a link planted in its place would
        # be truncated as root, so it is refused before the tool runs.
        safefs.check(log_file, anchor=layout.install_local)
        chosen = installer.headers.steps.build_compiler(ctx)
        env, note = chosen.env, chosen.note
        log.info("building %s modules for kernel %s (%s)", t.flavour, t.kernel, note)
        with staged_dir(final, within=layout.anchor_for(final)) as staging, \
                scratch(layout.tmp, within=layout.cache_anchor) as tmp:
            request = BuildRequest(
                extracted=layout.extracted(t.version),
                version=t.version,
                kernel=t.kernel,
                flavour=t.flavour,
                kernel_source=str(t.headers.source_path),
                kernel_output=str(t.headers.output_path),
                install_path=staging,
                log_file=log_file,
                tmpdir=tmp,
                signing_key=ctx.root.local(ctx.config.signing_key) if ctx.config.signing_key
                else None,
                signing_cert=ctx.root.local(ctx.config.signing_cert) if ctx.config.signing_cert
                else None,
            )
            # nvidia-peermem's Kbuild reads OFED's sources at /usr/src/ofa_kernel: the host's.
            trees = gpudirect.with_ofed_sources(ctx, t.headers)
            argv = header_trees.with_host_trees(ctx.root, trees, build_modules_argv(request))
            try:
                ctx.runner.run(argv, env=env, stream=True, timeout=3600)
            except CommandFailed as exc:
                raise ModuleBuildFailed(
                    f"building the {t.flavour} kernel modules of {t.version} for kernel "
                    f"{t.kernel} failed (exit {exc.returncode})"
                    + _compiler_errors(log_file)
                    + f"; last lines of {log_file.name}:\n" + _tail(log_file, exc.output_tail),
                ) from exc
            _check_built(staging, t.version)
            mark_complete(staging, f"{t.version} {t.kernel} {t.flavour}\n")
        log.info("built %s", ", ".join(p.name for p in sorted(final.glob("*.ko"))))

    return Step("build-modules", f"compile {t.flavour} modules for {t.kernel} (cached per "
                "version, kernel and flavour)", satisfied, apply)


def _check_built(staging: Path, version: str) -> None:
    if not (staging / "nvidia.ko").is_file():
        raise ModuleBuildFailed(f"the build left no nvidia.ko in {staging}")
    if not module_version_matches(staging / "nvidia.ko", version):
        raise ModuleBuildFailed(f"the built nvidia.ko is not version {version}")


# gcc's diagnostics: `nvidia/nv-pci.c:223:9: error: too few arguments to function ...`.
_COMPILER_ERROR = r"^\S+:\d+:(?:\d+:)? (?:fatal )?error: "


def _compiler_errors(log_file: Path, limit: int = 5) -> str:
    """The compiler's own `error:` lines from the build log: nvidia-installer runs make -k, so
    they sit far above the log's tail (make goes on compiling every other file)."""
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return ""
    found = list(dict.fromkeys(line.strip() for line in text.splitlines()
                               if re.match(_COMPILER_ERROR, line.strip())))
    if not found:
        return ""
    more = f" (and {len(found) - limit} more)" if len(found) > limit else ""
    return "; the compiler said:\n" + "\n".join(found[:limit]) + more


def _tail(log_file: Path, fallback: str, lines: int = 25) -> str:
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return fallback
    return "\n".join(text.splitlines()[-lines:]) or fallback


def userspace_step(ctx: Context) -> Step:
    t, layout = ctx.target, ctx.layout
    final = layout.version_dir(t.version)

    def satisfied() -> bool:
        return userspace_installed(ctx)

    def apply() -> None:
        with staged_dir(final, within=layout.anchor_for(final)) as staging:
            place_userspace(ctx, staging)
            mark_complete(staging, t.version + "\n")
        log.info("installed user-space files of %s into %s", t.version, final)

    return Step("install-userspace", "nvidia-smi, libraries and firmware into versions/<ver>",
                satisfied, apply)


def place_userspace(ctx: Context, staging: Path) -> None:
    """nvidia-installer's user-space pass of the extracted tree into the empty `staging`, the
    firmware and the soname links, and the listing of what was placed (what a registry
    artifact of this user space holds)."""
    t, layout = ctx.target, ctx.layout
    extracted = layout.extracted(t.version)
    safefs.check(layout.installer_log, anchor=layout.install_local)  # as the build log
    with scratch(layout.tmp, within=layout.cache_anchor) as tmp:
        argv = install_userspace_argv(extracted, staging, layout.installer_log, tmp)
        try:
            ctx.runner.run(argv, stream=True, timeout=1800)
        except CommandFailed as exc:
            raise InstallFailed(
                f"nvidia-installer failed to install the user-space files of "
                f"{t.version}: " + _tail(layout.installer_log, exc.output_tail)) from exc
    copied = copy_firmware(extracted, staging / "firmware")
    if copied:
        log.info("GSP firmware from the extracted tree: %s", ", ".join(copied))
    # Soname links (libnvidia-ml.so.1 -> .so.<ver>) before the switch, so an interrupted
    # run never leaves an active version without them.
    ctx.runner.run(["ldconfig", "-n", str(staging / "lib64")], timeout=120)
    write_listing(staging)


def copy_firmware(extracted: Path, dest: Path) -> list[str]:
    """The tree's firmware/gsp_*.bin into `dest`, whichever nvidia-installer pass (if any)
    would have written them. Returns the names copied. The dir exists afterwards even for
    drivers without GSP firmware."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for source in sorted((extracted / "firmware").glob("gsp_*.bin")):
        target = dest / source.name
        if target.is_file() and target.stat().st_size == source.stat().st_size:
            continue
        shutil.copyfile(source, target)
        os.chmod(target, 0o644)
        copied.append(source.name)
    return copied
