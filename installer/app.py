"""The commands behind the CLI, independent of click: run, plan, verify, status, uninstall,
versions, download, prebuild."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import host, nextkernel, outcome, pipeline, planner, state
from installer.cluster import upgrade_gate
from installer.config import Config
from installer.errors import InstallerError
from installer.hostroot import HostRoot
from installer.layout import GPUS_READY_FILE, LD_DROP_IN, READY_FILE, Layout
from installer.plan import Plan, StepOutcome
from installer.release import catalog, download
from installer.runner import Runner, SubprocessRunner

if TYPE_CHECKING:
    from installer.cluster import signals

log = logging.getLogger(__name__)


def build_plan(config: Config, runner: Runner | None = None, arch: str | None = None) -> Plan:
    plan = planner.make_plan(
        config,
        runner or SubprocessRunner(),
        fetch_bytes=download.fetch_bytes_for(config),
        fetch_runfile=download.fetch_runfile_for(config),
        machine=arch,
    )
    nextkernel.extend(plan, build_modules)  # the next kernel before the reboot
    return plan


def run(config: Config, runner: Runner | None = None) -> list[StepOutcome]:
    """Install (or confirm) the planned driver under the host lock. Every run, success or
    failure, leaves its outcome in the install dir (outcome.py; the metrics read it)."""
    progress = outcome.Progress()
    try:
        outcomes = _run(config, runner or SubprocessRunner(), progress)
    except Exception as error:
        if progress.install_dir is None:
            progress.install_dir = _install_dir(config)
        outcome.record_run(progress, error)
        raise
    outcome.record_run(progress, None)
    return outcomes


def _install_dir(config: Config) -> Path | None:
    try:
        return Layout.from_config(config, HostRoot(config.root)).install_local
    except (InstallerError, OSError):
        return None


def _run(config: Config, runner: Runner,
         progress: outcome.Progress) -> list[StepOutcome]:
    started = time.monotonic()
    # The node's condition and Events (NVIDIA_INSTALLER_CLUSTER_SIGNALS), told every outcome;
    # with the signals off the cluster client is never imported.
    told = _told(config)
    try:
        # Refusals (bad version, unsupported host, no GPU, Secure Boot without keys) come from a
        # read-only plan, before the install dir or its lock exist.
        # Every step probes the host again when it runs, so the plan stays valid under the lock.
        plan = build_plan(config, runner)
        layout = plan.context.layout
        progress.install_dir, progress.target = layout.install_local, plan.context.target
        planner.require_go_ahead(plan)
        # Only now: a refusal is no failure of the plan's first step.
        progress.steps = [step.name for step in plan.steps]
        layout.install_local.mkdir(parents=True, exist_ok=True)
        with state.HostLock(layout.lock_file, config.lock_timeout):
            for decision in plan.decisions:
                log.info("plan: %s = %s (%s)", decision.topic, decision.value, decision.reason)
            if told:
                told.started(plan.context.target)
            outcomes = _execute(config, layout, plan, progress.done)
    except InstallerError as error:
        if told:
            told.failed(error)
        raise
    if told:
        told.succeeded(outcomes, plan.context.target.version, time.monotonic() - started)
    applied = [o.name for o in outcomes if o.status == "applied"]
    commands = getattr(runner, "command_seconds", 0.0)
    log.info("done in %.2f s (%.2f s in external commands): %s", time.monotonic() - started,
             commands,
             f"applied {', '.join(applied)}" if applied else "every step was already satisfied")
    return outcomes


def _told(config: Config) -> signals.Told | None:
    if not config.cluster_signals:
        return None
    from installer.cluster import signals

    return signals.Told(config)


def _execute(config: Config, layout: Layout, plan: Plan,
             done: list[StepOutcome] | None = None) -> list[StepOutcome]:
    from dataclasses import replace

    done = [] if done is None else done
    # The node is given back (restored, uncordoned) before the next kernel's modules
    # are prepared.
    install, after = nextkernel.split_steps(plan.steps)
    # The node restored (or marked failed) after an upgrade; restored too when an earlier run
    # left it mid-upgrade and the protocol is off now, so no node stays cordoned for good.
    gate = upgrade_gate.of(plan.context)
    try:
        outcomes = pipeline.execute(replace(plan, steps=install), done)
    except InstallerError as error:
        gate.failed(config, layout, error)
        raise
    gate.finished(config, layout)
    for step in after:
        done.append(pipeline.run_step(step))
        outcomes.append(done[-1])
    return outcomes


def describe_plan(plan: Plan) -> list[str]:
    """Human-readable plan: host facts, decisions with reasons, steps and their state."""
    ctx = plan.context
    facts = ctx.facts
    lines = ["host:"]
    lines.append(f"  distro: {facts.distro} (family {facts.distro.family})")
    lines.append(f"  kernel: {facts.kernel_release}   arch: {facts.arch}")
    if facts.gpus:
        for gpu in facts.gpus:
            lines.append(f"  gpu: {gpu.address} {gpu.pci_id}")
    else:
        lines.append("  gpu: none found in /sys/bus/pci/devices")
    loaded = facts.loaded_driver
    lines.append(f"  loaded driver: {loaded.version} ({loaded.flavour})" if loaded
                 else "  loaded driver: none")
    lines.append(f"  nouveau loaded: {'yes' if facts.nouveau_loaded else 'no'}")
    lines.append(f"  secure boot: {facts.secure_boot.detail}")
    lines.append(f"  free space at install dir: {facts.free_bytes / 2**30:.1f} GiB")
    lines.append("decisions:")
    for decision in plan.decisions:
        lines.append(f"  {decision.topic}: {decision.value}")
        lines.append(f"      because {decision.reason}")
    if plan.blockers:
        lines.append("blocked:")
        lines += [f"  {b} (run fails with no-nvidia-gpu unless --allow-no-gpu)"
                  for b in plan.blockers]
    lines.append("steps:")
    for step in plan.steps:
        status = "satisfied" if step.is_satisfied() else "would run"
        lines.append(f"  {step.name:<22} {status:<10} {step.summary}")
    return lines


def verify_installed(config: Config, runner: Runner | None = None) -> Any:
    """Verify the driver that is loaded now against the record (or the requested version)."""
    from installer import components, steps, verify
    from installer.release import versions

    root = HostRoot(config.root)
    layout = Layout.from_config(config, root)
    gpus = host.nvidia_gpus(root)
    record = state.read_record(layout.state_file)
    expected = record.version if record else None
    if record is None and versions.parse_request(config.version).kind == "exact":
        expected = config.version
    fabric_required, switches = components.fabric_required(root)  # NVSwitch nodes
    loaded = host.loaded_driver(root)
    major = (expected or (loaded.version if loaded else None) or "0").split(".", 1)[0]
    coherent = steps.coherent_memory(config, root, gpus, int(major) if major.isdigit() else 0)
    report = verify.verify(
        install_dir=layout.install_local,
        expected_version=expected,
        expected_gpus=[g.address for g in gpus],
        runner=runner or SubprocessRunner(),
        fabric_required=fabric_required,
        switches=switches,
        arch=host.normalise_arch(host.host_machine(root)),
        # Any GPU that reports a fabric must have completed it, whatever the board.
        require_fabric=True,
        diagnose=lambda reported: components.fabric_diagnosis(root, reported),
        coherent_memory=(steps.coherent_memory_mode(root), coherent.expected),
    )
    sections = components.verify_sections(config, root)  # IMEX's channel device, nvidia_peermem
    problems = components.verify_problems(config, root)  # nvidia-peermem asked for, not loaded
    if problems:
        report = dataclasses.replace(report, problems=(*report.problems, *problems))
    return dataclasses.replace(report, sections=sections) if sections else report


def status(config: Config) -> dict[str, Any]:
    root = HostRoot(config.root)
    layout = Layout.from_config(config, root)
    record = state.read_record(layout.state_file)
    driver = host.loaded_driver(root)
    ready = root.read_text(READY_FILE)
    return {
        "install_dir": str(layout.install_host),
        "record": json.loads(record.to_json()) if record else None,
        "loaded_driver": {"version": driver.version, "flavour": driver.flavour} if driver
        else None,
        "ready": ready is not None,
        "ready_file": str(READY_FILE),
        "next_kernel": nextkernel.status(config, root, layout, record),
        "daemons": _daemons(root),  # Fabric Manager, persistenced
        "last_run": outcome.read(outcome.outcome_path(layout.install_local)),
        # What a file on the node holds is untrusted: a malformed record reads as absent
        # above, and is named here.
        "invalid_records": _invalid_records(root, layout),
    }


def _invalid_records(root: HostRoot, layout: Layout) -> dict[str, str]:
    from installer.components import names
    from installer.metrics import snapshot

    return {k: v for k, v in snapshot.record_problems(root, layout, names()).items() if v}


def _daemons(root: HostRoot) -> dict[str, Any]:
    """What each component's container command (`installer fabricmanager`, ...) last said
    (their files)."""
    from installer.components import commands, supervisor

    found: dict[str, Any] = {}
    for name in commands():
        text = root.read_text(supervisor.ready_file(name))
        found[name] = dict(line.split("=", 1) for line in text.splitlines() if "=" in line) \
            if text else None
    return found


def uninstall(config: Config, runner: Runner | None = None) -> list[str]:
    """Unload the driver and remove what the installer put on the host. Returns what it
    removed. Raises DriverInUse when the driver is held."""
    from installer import components, kmod
    from installer.cluster import scheduling_gate_steps
    from installer.dirs import remove_tree
    from installer.steps import ldcache

    runner = runner or SubprocessRunner()
    root = HostRoot(config.root)
    layout = Layout.from_config(config, root)
    removed: list[str] = []
    with state.HostLock(layout.lock_file, config.lock_timeout):
        record = state.read_record(layout.state_file)
        holders = components.holders(root, layout, config)
        # When the unload goes ahead, the scheduling gate closes (the label goes),
        # then our daemons stop (they run again only for a driver verified anew).
        scheduling_gate_steps.close_before_unload(config, root, "uninstalling the driver",
                                                  drop_label=True)
        with components.paused(root, layout, config, when=not holders):
            kmod.unload(root, runner, holders)
        removed += kmod.remove_nodes(layout.dev_dir)
        root.local(GPUS_READY_FILE).unlink(missing_ok=True)
        ready = root.local(READY_FILE)
        if ready.exists():
            ready.unlink()
            removed.append(str(READY_FILE))
        kernels = set(record.kernels if record else ()) | {host.kernel_release(root)}
        for kernel in sorted(kernels):
            target = root.local_resolved(layout.host_modules_dir(kernel))
            if target.exists():
                remove_tree(target)
                removed.append(str(layout.host_modules_dir(kernel)))
                runner.run(kmod.depmod_argv(root, kernel), check=False, timeout=300)
        if record:
            fw = root.local_resolved(layout.host_firmware_dir(record.version))
            if fw.exists():
                remove_tree(fw)
                removed.append(str(layout.host_firmware_dir(record.version)))
        if root.local(LD_DROP_IN).exists():
            ldcache.remove(root, runner)
            removed.append(str(LD_DROP_IN))
        from installer import sources

        left = sources.recorded(record.source).left_on_host() if record else None
        if left:
            log.warning("%s", left)
        for name in ("bin", "lib64", "drivers", "current", "versions", "cache", "state.json",
                     outcome.OUTCOME_FILE, ".cache", "nvidia-installer.log",
                     "nvidia-installer-build.log"):
            path = layout.install_local / name
            if path.exists() or path.is_symlink():
                remove_tree(path)
                removed.append(str(layout.install_host / name))
    return removed


def serve_gate(config: Config) -> None:
    """`installer gate`: keep the node's scheduling gate in step with its readiness
    until SIGTERM. Raises ConfigError when the gate is off."""
    from installer.errors import ConfigError

    if not (config.scheduling_gate or config.cluster_signals):
        raise ConfigError("`installer gate` needs NVIDIA_INSTALLER_SCHEDULING_GATE=true or "
                          "NVIDIA_INSTALLER_CLUSTER_SIGNALS=true (and NODE_NAME)")
    from installer import components
    from installer.cluster import scheduling_gate

    scheduling_gate.serve(config, components.names())


def list_versions(config: Config) -> list[str]:
    loaded = catalog.load(config.catalog, download.fetch_bytes_for(config))
    lines = []
    for branch in loaded.branches:
        releases = ", ".join(r.version for r in branch.releases)
        lines.append(f"R{branch.major:<4} {branch.type:<20} {releases}")
    return lines


# The steps that produce (and publish) the modules of one key, nothing on the host.
_PREBUILD_STEPS = ("fetch-runfile", "extract-runfile", "kernel-headers", "build-modules")


def build_modules(config: Config, runner: Runner,
                  steps: tuple[str, ...] = _PREBUILD_STEPS, arch: str | None = None) -> Plan:
    """Plan for `config.kernel_release` and run its steps named in `steps`, in plan order: the
    modules land in the install dir's cache; nothing is installed or loaded. The caller holds
    the host lock. Raises the steps' errors (headers, compiler, download, build). `arch`
    (default: this machine's) other than this machine's is cross-compiled."""
    plan = build_plan(config, runner, arch)
    for decision in plan.decisions:
        log.info("plan: %s = %s (%s)", decision.topic, decision.value, decision.reason)
    for step in plan.steps:
        if step.name in steps:
            pipeline.run_step(step)
    return plan


def prebuild(config: Config, runner: Runner | None = None, arch: str | None = None) -> str:
    """Build the modules for `config.kernel_release` into the install dir's cache and, with
    `module_registry_push`, publish them; returns the module dir or the pushed reference.
    Loads nothing and installs nothing on the host. Raises the build's errors, and the
    registry's (registry-unavailable, registry-auth-failed) when pushing."""
    from dataclasses import replace

    from installer import sources
    from installer.sources.prebuilt import modules as prebuilt_modules

    # Never pull what we are asked to build; the lookup below only reports.
    config = replace(config, allow_no_gpu=True, source=sources.module_builder().name)
    runner = runner or SubprocessRunner()
    root = HostRoot(config.root)
    layout = Layout.from_config(config, root)
    layout.install_local.mkdir(parents=True, exist_ok=True)
    with state.HostLock(layout.lock_file, config.lock_timeout):
        plan = build_modules(config, runner, arch=arch)
        t = plan.context.target
        built = layout.module_build(t.version, t.kernel, t.flavour)
        if not config.module_registry_push:
            return str(built)
        artifact = prebuilt_modules.publish(plan.context)
        if plan.context.facts.arch != host.normalise_arch():
            # The user space is placed by the target's nvidia-installer, which cannot run here.
            log.warning("the %s user space is not published by a cross build: the first %s "
                        "node that installs the .run with NVIDIA_MODULE_REGISTRY_PUSH=true "
                        "publishes it", plan.context.facts.arch, plan.context.facts.arch)
            return f"{artifact.reference}"
        from installer.sources.prebuilt import userspace
        from installer.sources.runfile import steps as runfile_steps

        # Only warns: the modules come first.
        userspace.publish_for_prebuild(plan.context, runfile_steps.place_userspace)
        return f"{artifact.reference}"


def prepare_next_kernel(config: Config, watch: float | None = None,
                        runner: Runner | None = None) -> str:
    """`installer prepare-next-kernel`: the installed driver's modules for a newer installed
    kernel into the cache, once (returns what happened) or every `watch` seconds, for ever."""
    runner = runner or SubprocessRunner()
    if watch is not None:
        nextkernel.watch(config, runner, build_modules, watch)
    return nextkernel.prepare_installed(config, runner, build_modules)
