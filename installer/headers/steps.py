"""The steps that get headers and pick the compiler before anything large is downloaded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from installer.headers import compiler, fetch
from installer.headers.trees import SOURCE_MARKER
from installer.plan import Context, Decision, Headers, Step


def local_tree(ctx: Context, headers: Headers) -> Path:
    """Where this process reads the output (configured) header tree."""
    if headers.in_container:
        return Path(str(headers.output_path))
    if headers.unpacked_root is not None:
        return headers.unpacked_root.joinpath(*headers.output_path.parts[1:])
    return ctx.root.local(headers.output_path)


def kernel_gcc(ctx: Context) -> tuple[int | None, str]:
    """The target kernel's gcc major and where it was read: the headers' config, else
    /proc/version when the target is the running kernel."""
    t = ctx.target
    if t.headers is not None:
        major = compiler.headers_gcc_major(local_tree(ctx, t.headers))
        if major is not None:
            return major, "the headers' CONFIG_GCC_VERSION"
    from installer import host

    if t.kernel == host.kernel_release(ctx.root):
        major = compiler.kernel_gcc_major(ctx.root.read_text("/proc/version"))
        if major is not None:
            return major, "/proc/version"
    return None, "unknown"


def headers_step(ctx: Context, built: Callable[[], bool]) -> Step:
    t = ctx.target

    def satisfied() -> bool:
        return built() or t.headers is not None

    def apply() -> None:
        # A kernel whose gcc is known already (/proc/version) fails before fetching anything.
        major, source = kernel_gcc(ctx)
        if (major is not None and compiler.choose(ctx.runner, major) is None
                and compiler.installable(major, ctx.config.compiler_packages) is None):
            raise compiler.missing_error(t.kernel, major, source, ctx.runner)
        t.headers = fetch.obtain(ctx.root, ctx.config, ctx.facts, ctx.layout, ctx.runner)

    return Step("kernel-headers", f"headers for kernel {t.kernel} (host, image, cache, or "
                "fetched from the host's package sources) before any download", satisfied, apply)


def compiler_step(ctx: Context, built: Callable[[], bool]) -> Step:
    t = ctx.target

    def satisfied() -> bool:
        if built():
            return True
        major, _ = kernel_gcc(ctx)
        return compiler.choose(ctx.runner, major) is not None

    def apply() -> None:
        major, source = kernel_gcc(ctx)
        assert major is not None
        package = compiler.installable(major, ctx.config.compiler_packages)
        if package is None:
            raise compiler.missing_error(t.kernel, major, source, ctx.runner)
        compiler.install(ctx.runner, package, t.kernel)

    return Step("check-compiler", "the kernel's gcc major from the image, or installed from the "
                "image's package sources, before any download", satisfied, apply)


def build_compiler(ctx: Context) -> compiler.Compiler:
    """The gcc a build uses (CC=gcc-N when the default gcc is another major)."""
    major, source = kernel_gcc(ctx)
    chosen = compiler.choose(ctx.runner, major)
    if chosen is None:
        assert major is not None
        raise compiler.missing_error(ctx.target.kernel, major, source, ctx.runner)
    return chosen



def path_decisions(headers: Headers | None) -> list[Decision]:
    """What `plan` says about the two paths nvidia-installer is given, and why."""
    if headers is None:
        return [Decision("kernel-source-path", "from the fetched headers",
                         f"--kernel-source-path is the unpacked tree with {SOURCE_MARKER} and "
                         "--kernel-output-path the configured one (Debian: linux-headers-<abi>-"
                         "common and linux-headers-<k>; Ubuntu, RHEL: one tree for both)")]
    return [
        Decision("kernel-source-path", str(headers.source_path), headers.source_why),
        Decision("kernel-output-path", str(headers.output_path), headers.output_why),
    ]
