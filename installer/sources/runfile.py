"""NVIDIA's `.run`: where to get it, extracting it once, and the nvidia-installer argv we run."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from installer import download, kernel
from installer.config import Config
from installer.errors import CommandFailed, InstallFailed, ModuleBuildFailed
from installer.headers import steps as header_steps
from installer.plan import Context, Step
from installer.steps import COMPLETE_MARKER, remove_tree

log = logging.getLogger(__name__)

def runfile_name(version: str, arch: str) -> str:
    return f"NVIDIA-Linux-{arch}-{version}.run"


def download_urls(config: Config, version: str, arch: str, default_url: str) -> list[str]:
    """URLs to try in order: an explicit URL alone, else each mirror's
    `<mirror>/<v>/<runfile>`, then the default (catalog or GKE layout)."""
    if config.download_url:
        return [config.download_url]
    name = runfile_name(version, arch)
    urls = [f"{mirror.rstrip('/')}/{version}/{name}" for mirror in config.mirrors]
    urls.append(default_url)
    return urls


def extract_argv(runfile: Path, target: Path, tmpdir: Path) -> list[str]:
    return ["sh", str(runfile), "--extract-only", "--target", str(target), "--tmpdir", str(tmpdir)]


def is_extracted(directory: Path) -> bool:
    return (directory / "nvidia-installer").is_file() and (directory / ".extracted").is_file()


def module_type_args(version: str, flavour: str) -> list[str]:
    """`-M` exists from R560 on; older installers spell it `-m=kernel-open|kernel`."""
    if int(version.split(".")[0]) >= 560:
        return [f"--kernel-module-type={flavour}"]
    return ["-m=kernel-open" if flavour == "open" else "-m=kernel"]


@dataclass(frozen=True)
class BuildRequest:
    extracted: Path
    version: str
    kernel: str
    flavour: str
    kernel_source: str
    install_path: Path
    log_file: Path
    tmpdir: Path
    signing_key: Path | None = None
    signing_cert: Path | None = None
    jobs: int = 0


def build_modules_argv(req: BuildRequest) -> list[str]:
    """Build and install only the kernel modules into `install_path` (no load, no depmod)."""
    jobs = req.jobs or min(os.cpu_count() or 1, 32)
    argv = [
        str(req.extracted / "nvidia-installer"),
        "--silent",
        "--accept-license",
        "--kernel-modules-only",
        f"--kernel-name={req.kernel}",
        f"--kernel-source-path={req.kernel_source}",
        f"--kernel-install-path={req.install_path}",
        *module_type_args(req.version, req.flavour),
        "--no-drm",
        "--skip-module-load",
        "--skip-depmod",
        "--no-nouveau-check",
        "--no-rebuild-initramfs",
        f"--concurrency-level={jobs}",
        f"--log-file-name={req.log_file}",
        f"--tmpdir={req.tmpdir}",
    ]
    if req.signing_key and req.signing_cert:
        argv += [
            f"--module-signing-secret-key={req.signing_key}",
            f"--module-signing-public-key={req.signing_cert}",
        ]
    return argv


def install_userspace_argv(
    extracted: Path, prefix: Path, log_file: Path, tmpdir: Path
) -> list[str]:
    """Install the user-space files under `prefix` only: every destination flag is given."""
    return [
        str(extracted / "nvidia-installer"),
        "--silent",
        "--accept-license",
        "--no-kernel-modules",
        f"--utility-prefix={prefix}",
        "--utility-libdir=lib64",
        f"--opengl-prefix={prefix}",
        "--opengl-libdir=lib64",
        f"--x-prefix={prefix}",
        f"--x-module-path={prefix}/lib64/xorg/modules",
        f"--x-library-path={prefix}/lib64",
        f"--documentation-prefix={prefix}",
        f"--override-file-type-destination=FIRMWARE:{prefix}/firmware",
        "--no-install-compat32-libs",
        "--no-install-libglvnd",
        "--no-rpms",
        "--no-backup",
        "--no-check-for-alternate-installs",
        "--no-distro-scripts",
        "--no-systemd",
        "--no-rebuild-initramfs",
        "--no-nouveau-check",
        f"--log-file-name={log_file}",
        f"--tmpdir={tmpdir}",
    ]




# --- steps -----------------------------------------------------------------------------------


def runfile_steps(ctx: Context) -> list[Step]:
    # Headers and compiler first: a node that cannot build fails before the large download.
    return [headers_step(ctx), compiler_step(ctx), fetch_step(ctx), extract_step(ctx),
            build_step(ctx), userspace_step(ctx)]


def _built(ctx: Context) -> bool:
    t = ctx.target
    return (ctx.layout.module_build(t.version, t.kernel, t.flavour) / COMPLETE_MARKER).is_file()


def _userspace_done(ctx: Context) -> bool:
    return (ctx.layout.version_dir(ctx.target.version) / COMPLETE_MARKER).is_file()


def _runfile_needed(ctx: Context) -> bool:
    return not (_built(ctx) and _userspace_done(ctx))


def fetch_step(ctx: Context) -> Step:
    name = runfile_name(ctx.target.version, ctx.facts.arch)

    def satisfied() -> bool:
        return (
            not _runfile_needed(ctx)
            or is_extracted(ctx.layout.extracted(ctx.target.version))
            or download.find_cached(ctx.layout.downloads, name, sha256=ctx.config.sha256)
            is not None
        )

    def apply() -> None:
        ctx.runfile = ctx.fetch_runfile(ctx.target.urls, ctx.layout.downloads, name)

    return Step("fetch-runfile", f"download {name} (retries, resume, checksum, cache)",
                satisfied, apply)


def extract_step(ctx: Context) -> Step:
    directory = ctx.layout.extracted(ctx.target.version)

    def satisfied() -> bool:
        return not _runfile_needed(ctx) or is_extracted(directory)

    def apply() -> None:
        runfile = ctx.runfile or ctx.layout.downloads / runfile_name(ctx.target.version,
                                                                     ctx.facts.arch)
        staging = directory.with_name(f".{directory.name}.tmp")
        remove_tree(staging)
        remove_tree(directory)
        ctx.layout.tmp.mkdir(parents=True, exist_ok=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
        try:
            ctx.runner.run(extract_argv(runfile, staging, ctx.layout.tmp), timeout=600)
        except CommandFailed as exc:
            remove_tree(staging)
            raise InstallFailed(f"extracting {runfile.name} failed: {exc.output_tail}",
                                hint="The file may be damaged: delete it from the cache "
                                f"({ctx.layout.downloads}) and run again.") from exc
        (staging / ".extracted").write_text(ctx.target.version + "\n")
        os.replace(staging, directory)
        log.info("extracted %s", runfile.name)

    return Step("extract-runfile", "extract the .run once into the cache", satisfied, apply)


def headers_step(ctx: Context) -> Step:
    return header_steps.headers_step(ctx, lambda: _built(ctx))


def compiler_step(ctx: Context) -> Step:
    return header_steps.compiler_step(ctx, lambda: _built(ctx))


def build_step(ctx: Context) -> Step:
    t, layout = ctx.target, ctx.layout
    final = layout.module_build(t.version, t.kernel, t.flavour)

    def satisfied() -> bool:
        return _built(ctx)

    def apply() -> None:
        assert t.headers is not None
        staging = final.with_name(f".{final.name}.tmp")
        remove_tree(staging)
        staging.mkdir(parents=True)
        layout.tmp.mkdir(parents=True, exist_ok=True)
        log_file = layout.install_local / "nvidia-installer-build.log"
        request = BuildRequest(
            extracted=layout.extracted(t.version),
            version=t.version,
            kernel=t.kernel,
            flavour=t.flavour,
            kernel_source=str(t.headers.host_path),
            install_path=staging,
            log_file=log_file,
            tmpdir=layout.tmp,
            signing_key=ctx.root.local(ctx.config.signing_key) if ctx.config.signing_key else None,
            signing_cert=ctx.root.local(ctx.config.signing_cert) if ctx.config.signing_cert
            else None,
        )
        chosen = header_steps.build_compiler(ctx)
        env, note = chosen.env, chosen.note
        log.info("building %s modules for kernel %s (%s)", t.flavour, t.kernel, note)
        argv = kernel.with_host_trees(ctx.root, t.headers, build_modules_argv(request))
        try:
            ctx.runner.run(argv, env=env, stream=True, timeout=3600)
        except CommandFailed as exc:
            remove_tree(staging)
            raise ModuleBuildFailed(
                f"building the {t.flavour} kernel modules of {t.version} for kernel {t.kernel} "
                f"failed (exit {exc.returncode}); last lines of {log_file.name}:\n"
                + _tail(log_file, exc.output_tail),
            ) from exc
        if not (staging / "nvidia.ko").is_file():
            raise ModuleBuildFailed(f"the build left no nvidia.ko in {staging}")
        (staging / COMPLETE_MARKER).write_text(f"{t.version} {t.kernel} {t.flavour}\n")
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_tree(final)
        os.replace(staging, final)
        log.info("built %s", ", ".join(p.name for p in sorted(final.glob("*.ko"))))

    return Step("build-modules", f"compile {t.flavour} modules for {t.kernel} (cached per "
                "version, kernel and flavour)", satisfied, apply)


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
        return _userspace_done(ctx)

    def apply() -> None:
        staging = final.with_name(f".{final.name}.tmp")
        remove_tree(staging)
        staging.mkdir(parents=True)
        layout.tmp.mkdir(parents=True, exist_ok=True)
        argv = install_userspace_argv(layout.extracted(t.version), staging,
                                      layout.installer_log, layout.tmp)
        try:
            ctx.runner.run(argv, stream=True, timeout=1800)
        except CommandFailed as exc:
            remove_tree(staging)
            raise InstallFailed(
                f"nvidia-installer failed to install the user-space files of {t.version}: "
                + _tail(layout.installer_log, exc.output_tail)) from exc
        # Soname links (libnvidia-ml.so.1 -> .so.<ver>) before the switch, so an interrupted
        # run never leaves an active version without them.
        ctx.runner.run(["ldconfig", "-n", str(staging / "lib64")], timeout=120)
        (staging / COMPLETE_MARKER).write_text(t.version + "\n")
        remove_tree(final)
        os.replace(staging, final)
        log.info("installed user-space files of %s into %s", t.version, final)

    return Step("install-userspace", "nvidia-smi, libraries and firmware into versions/<ver>",
                satisfied, apply)
