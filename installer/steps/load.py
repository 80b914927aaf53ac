"""The new driver loaded and checked: its modules, the device nodes, verification against the
plan, then the readiness file."""

from __future__ import annotations

import logging

from installer import kmod, state
from installer.errors import ModuleLoadFailed
from installer.layout import GPUS_READY_FILE, READY_FILE
from installer.plan import Context, Step
from installer.steps import coherent, rollback
from installer.steps.placement import restore_module_files

log = logging.getLogger(__name__)


def load_step(ctx: Context) -> Step:
    target = ctx.target

    def satisfied() -> bool:
        return kmod.all_loaded(ctx.root, target.version)

    def apply() -> None:
        via_modprobe = kmod.modules_dir_writable(ctx.root, target.kernel)
        user_args = {kmod.kernel_name(m): ctx.config.module_args_for(m)
                     for m in kmod.LOAD_ORDER}
        # Grace-coupled GPUs from R580 on: driver-managed coherent memory (steps/coherent.py).
        user_args["nvidia"] = [*user_args.get("nvidia", []), *coherent.decide(
            ctx.config, ctx.root, ctx.facts.gpus, target.branch).args]
        request = kmod.LoadRequest(
            kernel=target.kernel,
            via_modprobe=via_modprobe,
            module_dir=ctx.layout.module_build(target.version, target.kernel, target.flavour),
            user_args=user_args,
        )
        try:
            kmod.load(ctx.root, ctx.runner, request)
        except ModuleLoadFailed as exc:
            # A refused load leaves no half-activated install behind.
            undone = rollback.undo(ctx, restore_module_files)
            raise ModuleLoadFailed(
                exc.message + (f"; put back: {', '.join(undone)}" if undone else ""),
                hint=exc.hint) from exc

    return Step("load-modules", "load nvidia, nvidia-uvm, nvidia-modeset", satisfied, apply)


def device_nodes_step(ctx: Context) -> Step:
    def nodes() -> list[kmod.Node]:
        return kmod.expected_nodes(ctx.root, len(ctx.target.gpu_addresses))

    def satisfied() -> bool:
        dev = ctx.layout.dev_dir
        return not (kmod.missing_nodes(dev, nodes()) or kmod.missing_char_links(dev, nodes()))

    def apply() -> None:
        binary = ctx.layout.bin_dir / "nvidia-modprobe"
        env = {"LD_LIBRARY_PATH": str(ctx.layout.lib_dir)}
        if kmod.missing_nodes(ctx.layout.dev_dir, nodes()):
            kmod.create_nodes(ctx.runner, binary, len(ctx.target.gpu_addresses), env)
        kmod.link_char_nodes(ctx.layout.dev_dir, nodes())

    return Step("create-device-nodes", "nvidia-modprobe: /dev/nvidiaN per GPU, nvidiactl, "
                "modeset, uvm; /dev/char/<major>:<minor> links",
                satisfied, apply)


def verify_step(ctx: Context) -> Step:
    from installer import verify

    target = ctx.target

    def satisfied() -> bool:
        return _ready_matches(ctx) and kmod.all_loaded(ctx.root, target.version)

    def apply() -> None:
        from installer import components

        # Fabric Manager starts after this step (the long-running container keeps it): until
        # it has registered the GPUs in the NVLink fabric, CUDA answers 802 on such a node.
        fabric_starts_later, _ = components.fabric_required(ctx.root)
        report = verify.verify(
            install_dir=ctx.layout.install_local,
            expected_version=target.version,
            expected_gpus=list(target.gpu_addresses),
            runner=ctx.runner,
            fabric_starts_later=fabric_starts_later,
        )
        for line in report.summary_lines():
            log.info("verify: %s", line)
        if not report.ok:
            remove_ready_file(ctx)
        verify.require_ok(report)
        ctx.root.write_atomic(READY_FILE, state.ready_text(
            target.version, target.flavour, str(ctx.layout.install_host), target.kernel))
        log.info("driver ready: wrote %s", READY_FILE)

    return Step("verify-driver", "nvidia-smi and NVML answer with the planned version and GPUs; "
                "then the readiness file", satisfied, apply)


def _ready_matches(ctx: Context) -> bool:
    target = ctx.target
    return ctx.root.read_text(READY_FILE) == state.ready_text(
        target.version, target.flavour, str(ctx.layout.install_host), target.kernel
    )


def remove_ready_file(ctx: Context) -> None:
    """driver-ready and gpus-ready (the GPUs are no more usable than the driver is)."""
    ctx.root.local(GPUS_READY_FILE).unlink(missing_ok=True)
    path = ctx.root.local(READY_FILE)
    if path.exists():
        path.unlink()
        log.info("removed %s", READY_FILE)
