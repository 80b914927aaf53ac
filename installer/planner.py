"""Builds the plan: reads host facts, decides version, flavour, source and paths, lists steps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from installer import components, host, sources, steps
from installer.cluster import scheduling_gate_steps, upgrade_gate
from installer.config import Config, check_build_path
from installer.errors import NoNvidiaGpu
from installer.headers import platform
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.plan import Context, Decision, Plan, Step, Target
from installer.release import catalog, floors, versions
from installer.runner import Runner
from installer.sources import Groundwork, Source

if TYPE_CHECKING:
    from installer.cluster import pools

FetchBytes = Callable[[str], bytes]
FetchRunfile = Callable[[list[str], Path, str], Path]


def make_plan(
    config: Config,
    runner: Runner,
    *,
    fetch_bytes: FetchBytes,
    fetch_runfile: FetchRunfile,
    machine: str | None = None,
) -> Plan:
    """Decide everything `run` will do. Reads the host, changes nothing.

    Raises the errors of host detection and version resolution (unsupported-distro,
    invalid-version, unsupported-gpu, incompatible-gpus, catalog-unavailable, ...).
    """
    pool_decision: list[Decision] = []
    pool: pools.Pool | None = None
    if config.pool_policy:
        # The node's pool rule replaces the DaemonSet's version settings: read first, so a bad
        # policy or an unreadable node stops the run before anything else is looked at.
        from installer.cluster import pools

        config, pool = pools.apply(config)
        pool_decision.append(Decision("pool", pool.rule.name if pool.rule else "none",
                                      pool.reason))
    root = HostRoot(config.root)
    layout = Layout.from_config(config, root)
    # Host symlinks may lead the install dir or cache somewhere make would misread.
    check_build_path("the install dir as reached here", layout.install_local)
    check_build_path("the cache dir as reached here", layout.cache_local)
    # `machine` (prebuild --arch) plans for another architecture than this machine's.
    facts = host.gather(root, kernel_override=config.kernel_release,
                        free_space_path=layout.install_local, machine=machine)
    running = host.kernel_release(root)
    decisions: list[Decision] = pool_decision
    blockers: list[str] = []

    shipped_or_custom = catalog.load(config.catalog, fetch_bytes)
    # Floors are checked here, before anything is fetched: a release that cannot build on
    # this kernel or drive these GPUs is refused (or skipped by auto) rather than compiled.
    host_floors = floors.applicable(floors.shipped(), floors.HostShape(
        facts.kernel_release, facts.distro.id, facts.distro.version_id,
        tuple(g.device_id for g in facts.gpus)))
    resolution = versions.resolve(config.version, shipped_or_custom, facts.gpus,
                                  module_type=config.module_type, track=config.track,
                                  floors=host_floors, allow_below_floor=config.allow_below_floor)
    decisions.append(Decision("version", resolution.version, "; ".join(resolution.reasons)))
    decisions += [Decision("floor", floor.id, floor.describe().split(": ", 1)[1])
                  for floor in host_floors]
    decisions.append(Decision("kernel-module-type", resolution.flavour,
                              _flavour_reason(config.module_type, resolution.flavour)))

    build_ahead = facts.kernel_release != running
    load = bool(facts.gpus) and not build_ahead
    if build_ahead:
        decisions.append(Decision("kernel", facts.kernel_release,
                                  f"building ahead for {facts.kernel_release} (running: {running})"
                                  "; modules are built and installed, not loaded"))
    else:
        decisions.append(Decision("kernel", facts.kernel_release, "the running kernel"))
    if not facts.gpus:
        if config.allow_no_gpu:
            decisions.append(Decision("gpus", "none", "no NVIDIA GPU found; installing ahead "
                                      "of attaching GPUs (allow-no-gpu): nothing is loaded"))
        else:
            blockers.append("no NVIDIA GPU found in /sys/bus/pci/devices")

    source = _choose_source(config, facts)
    decisions.append(Decision("source", source.name, source.reason(
        config, facts, sources.passed_over(source, facts.distro))))
    arrival = source.arrival(Groundwork(config, root, layout, runner, facts, resolution.version,
                                        shipped_or_custom, running))
    decisions += arrival.decisions
    decisions.append(Decision("install-dir", str(layout.install_host),
                              f"NVIDIA_INSTALL_DIR_HOST, reached here at {layout.install_local}"))

    target = Target(
        version=resolution.version,
        branch=resolution.branch,
        flavour=resolution.flavour,
        kernel=facts.kernel_release,
        source=source.name,
        urls=arrival.urls,
        headers=arrival.headers,
        load=load,
        gpu_addresses=tuple(g.address for g in facts.gpus),
        stages_module_files=source.stages_module_files,
        replaces_user_space_before_unload=source.replaces_user_space_before_unload,
        ships_user_space=lambda component: source.ships_user_space(component, facts.distro),
    )
    ctx = Context(config, root, layout, runner, facts, target, fetch_runfile,
                  upgrade_gate=upgrade_gate.choose(config, pool))  # refuse or free a held driver
    decisions = source.decisions(ctx, decisions)
    decisions += platform.decisions(ctx)  # image tag, architecture, flavour, page size
    decisions.append(steps.coherent_memory(config, root, facts.gpus, resolution.branch).decision)
    decisions += components.decisions(ctx)  # GPUDirect RDMA, Fabric Manager on NVSwitch nodes
    return Plan(ctx, decisions, _steps(ctx), blockers)


def _steps(ctx: Context) -> list[Step]:
    source = sources.named(ctx.target.source)
    load = ctx.target.load
    plan = [steps.secure_boot_step(ctx)]
    gate = load and ctx.config.scheduling_gate  # tainted while not ready
    if gate:
        plan.append(scheduling_gate_steps.close_step(ctx))
    if load:
        plan.append(steps.nouveau_step(ctx))
    plan += source.steps(ctx)
    plan += components.steps(ctx)  # beside the user space in versions/<ver>
    # Stage everything on the host first, so the old driver is unloaded and the new one
    # loaded back to back: the node is without a driver for the shortest time.
    if load and not source.frees_driver_itself:
        plan.append(steps.driver_free_step(ctx))
    if source.stages_module_files:
        plan += [steps.module_files_step(ctx), steps.firmware_step(ctx)]
    if load:
        plan.append(steps.unload_old_step(ctx))
    plan.append(steps.activate_step(ctx))
    plan.append(steps.ld_cache_step(ctx))
    if load:
        plan.append(steps.load_step(ctx))
        plan += components.loaded_steps(ctx)  # GPUDirect RDMA's nvidia-peermem, where asked for
        plan += [steps.device_nodes_step(ctx), steps.verify_step(ctx)]
    plan += [steps.record_step(ctx), steps.prune_step(ctx)]
    if gate:
        plan.append(scheduling_gate_steps.open_step(ctx))
    return plan


def require_gpus(plan: Plan) -> None:
    if plan.blockers:
        raise NoNvidiaGpu("; ".join(plan.blockers))


def require_go_ahead(plan: Plan) -> None:
    """Raise what refuses this plan outright (read-only: nothing on the host has changed)."""
    require_gpus(plan)
    refusal = steps.secure_boot_refusal(plan.context) or platform.refusal(plan.context)
    if refusal is not None:
        raise refusal


def _flavour_reason(setting: str, flavour: str) -> str:
    if setting != "auto":
        return f"NVIDIA_KERNEL_MODULE_TYPE={setting}"
    return f"{flavour}: chosen by NVIDIA's rules for the GPUs found (see version reasons)"


def _choose_source(config: Config, facts: host.HostFacts) -> Source:
    # Under auto, the first source with evidence on this host (dnf where NVIDIA's repo
    # is configured: an offline check), else the one that builds modules (NVIDIA's .run).
    if config.source != "auto":
        chosen = sources.named(config.source)
        chosen.refuse_unless_offered(facts.distro)
        return chosen
    root = HostRoot(config.root)
    for candidate in sources.SOURCES:
        if candidate.offered(facts.distro) and candidate.evidence(root, config) is not None:
            return candidate
    return sources.module_builder()
