"""What `installer plan` says about the next kernel, and the `prepare-next-kernel` step a run
takes after the install is recorded."""

from __future__ import annotations

from pathlib import PurePosixPath

from installer import host
from installer.layout import Layout
from installer.nextkernel.cache import (
    BuildModules,
    modules_ready,
    origin,
    prepare_guarded,
    read_attempt,
)
from installer.nextkernel.detect import pending_kernel
from installer.plan import Context, Decision, Plan, Step

STEP_NAME = "prepare-next-kernel"


def _pending(ctx: Context) -> str | None:
    if "next-kernel" not in ctx.memo:
        ctx.memo["next-kernel"] = pending_kernel(ctx.root, ctx.target.kernel,
                                                 host.kernel_release(ctx.root))
    found = ctx.memo["next-kernel"]
    assert found is None or isinstance(found, str)
    return found


def decision(ctx: Context) -> Decision:
    """What `installer plan` says about the next kernel. Reads only."""
    t = ctx.target
    pending = _pending(ctx)
    if pending is None:
        return Decision("next-kernel", "none",
                        f"no kernel newer than {t.kernel} is installed (both "
                        "/lib/modules/<k>/modules.dep and /boot/vmlinuz-<k>)")
    from installer import sources

    elsewhere = sources.named(t.source).next_kernel_elsewhere(ctx.root, pending)
    if elsewhere is not None:
        there = ("an nvidia module is there" if elsewhere.present
                 else "none is there yet: its first boot builds or installs it")
        return Decision("next-kernel", f"{pending}: not prepared",
                        f"{elsewhere.why}; {elsewhere.where}: {there}")
    if modules_ready(ctx.layout, t.version, pending, t.flavour):
        return Decision("next-kernel", f"{pending}: modules ready",
                        f"{origin(ctx.layout, t.version, pending, t.flavour)} into "
                        f"{host_build(ctx.layout, t.version, pending, t.flavour)}; booting "
                        f"{pending} loads them with no compile and no download")
    setting = ctx.config.next_kernel
    if setting == "off":
        return Decision("next-kernel", f"{pending}: not prepared",
                        "NVIDIA_INSTALLER_NEXT_KERNEL=off: its first boot builds the modules")
    if setting == "separate":
        return Decision("next-kernel", f"{pending}: not prepared yet",
                        "NVIDIA_INSTALLER_NEXT_KERNEL=separate: `installer prepare-next-kernel` "
                        "(the DaemonSet's long-running container) prepares it, not `run`")
    previous = read_attempt(ctx.layout)
    tried = ""
    if previous and previous.get("kernel") == pending and previous.get("state") == "failed":
        error = previous.get("error") or {}
        tried = (f"; the last attempt failed ({previous.get('at')}: "
                 f"error[{error.get('reference')}]) and is retried")
    how = ("pulled from the module registry when an artifact matches, else compiled"
           if ctx.config.module_registry else "compiled")
    when = ("after the driver is verified and ready" if t.load
            else "after the modules are installed")
    return Decision("next-kernel", f"{pending}: prepared after this install",
                    f"{when}, before the run ends: {how} "
                    f"against its headers ({_headers_note(ctx, pending)}); a failure only "
                    f"warns{tried}")


def _headers_note(ctx: Context, kernel: str) -> str:
    from installer.headers import fetch, trees

    found = trees.find_headers(ctx.root, kernel)
    if found is not None:
        return f"on the host at {found.output_path}"
    if fetch.cached(ctx.layout, kernel) is not None:
        return f"fetched earlier into {ctx.layout.cache_host}/headers/{kernel}"
    if trees.find_container_headers(kernel) is not None:
        return "in the image"
    if ctx.config.fetch_headers == "false":
        return "none found, and fetching is off"
    return "fetched from the host's package sources"


def host_build(layout: Layout, version: str, kernel: str, flavour: str) -> PurePosixPath:
    return layout.cache_host / "modules" / version / kernel / flavour


def steps(ctx: Context, build: BuildModules) -> list[Step]:
    """`prepare-next-kernel` after the install is recorded (and verified, when loaded), when a
    newer kernel is installed and NVIDIA_INSTALLER_NEXT_KERNEL=run; a failure only warns."""
    t = ctx.target
    pending = _pending(ctx)
    from installer import sources

    if (pending is None or ctx.config.next_kernel != "run"
            or not sources.named(t.source).builds_modules):
        return []
    tried = [False]

    def satisfied() -> bool:
        return tried[0] or modules_ready(ctx.layout, t.version, pending, t.flavour)

    def apply() -> None:
        tried[0] = True
        prepare_guarded(ctx.config, ctx.runner, ctx.layout, pending, t.version, t.flavour,
                        build)

    return [Step(STEP_NAME, f"modules for the installed kernel {pending} (the next "
                 "boot's) into the cache, after the driver is ready; a failure only warns",
                 satisfied, apply)]


def split_steps(steps: list[Step]) -> tuple[list[Step], list[Step]]:
    """The plan's steps before `prepare-next-kernel`, and it with those after it: what has to
    finish before the node is given back (the upgrade protocol's uncordon) and what need not."""
    names = [step.name for step in steps]
    at = names.index(STEP_NAME) if STEP_NAME in names else len(steps)
    return steps[:at], steps[at:]




def extend(plan: Plan, build: BuildModules) -> None:
    """Add the next kernel to a plan: its decision, and `prepare-next-kernel` right after
    `record-install` (so after verify and the readiness file, before prune-cache drops the
    extracted tree its build reuses). Reads only."""
    plan.decisions.append(decision(plan.context))
    names = [step.name for step in plan.steps]
    at = names.index("record-install") + 1 if "record-install" in names else len(names)
    plan.steps[at:at] = steps(plan.context, build)
