"""NVLink5 nodes (HGX B200/B300): whether the ConnectX-7 "Limited PF" ports of the host's fabric
facts make one, the InfiniBand modules NVLSM needs, and why such a node's fabric is not
complete."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import NamedTuple

from installer import host, kmod
from installer.components import nvswitch
from installer.components.component import Part
from installer.errors import IbModuleLoadFailed, IbModulesMissing
from installer.host import FabricHardware, HostFacts, LpfPort
from installer.hostroot import HostRoot
from installer.plan import Context, Decision, ShippedBy, Step

log = logging.getLogger(__name__)

# NVLSM binds libibumad on an mlx5 IB port: the PCI driver, its IB half (which makes
# /sys/class/infiniband) and the user MAD device. Loaded in this order (each needs the one
# before), unloaded after NVLSM stops.
IB_MODULES = ("mlx5_core", "mlx5_ib", "ib_umad")
# Where nvlsm and nv-fabricmanager meet (the socket NVLSM opens once it manages the port).
FM_RUN_DIR = "/var/run/nvidia-fabricmanager"
NVLSM_PID_FILE = f"{FM_RUN_DIR}/nvlsm.pid"
SM_SOCKET = f"{FM_RUN_DIR}/fm_sm_ipc.socket"


class Nvlink5(NamedTuple):
    """Whether this is an NVLink5 node (its switches managed through LPF ports), and why."""

    ports: tuple[LpfPort, ...]
    reason: str

    @property
    def detected(self) -> bool:
        return bool(self.ports)

    @property
    def port(self) -> LpfPort | None:
        """The port NVLSM runs on: the first whose GUID is known, else the first."""
        with_guid = [p for p in self.ports if p.guid]
        chosen = with_guid or list(self.ports)
        return chosen[0] if chosen else None


def detect(ports: tuple[LpfPort, ...]) -> Nvlink5:
    """Whether the LPF ports of the host's fabric facts make this an NVLink5 node."""
    if not ports:
        return Nvlink5((), "no PCI function of vendor 15b3 whose VPD says SW_MNG (a ConnectX-7 "
                       "Limited PF managing NVLink switches)")
    first = ports[0]
    where = (f"{first.address} (15b3:{first.device_id:04x}"
             + (f", {first.ib_device}" if first.ib_device else "") + ")")
    guid = (f"port GUID {first.guid}" if first.guid else
            "port GUID known once mlx5_ib is loaded")
    return Nvlink5(ports, f"NVLink5 node: {len(ports)} ConnectX-7 Limited PF port(s) whose VPD "
                   f"says SW_MNG, first {where}, {guid}")


def fabric(hardware: FabricHardware, gpu_device_ids: tuple[int, ...]) -> nvswitch.Fabric:
    """Whether the node's fabric needs Fabric Manager on the node: NVSwitch functions on the
    host (HGX A100/H100/H200), or LPF ports (NVLink5, where NVLSM must run first); never for
    NVL72 trays, whose fabric is managed off the node."""
    switches = nvswitch.fabric(hardware.switches, gpu_device_ids)
    if switches.needed or switches.switches:
        return switches
    found = detect(hardware.lpf_ports)
    if not found.detected:
        return switches
    off_host = sorted(i for i in gpu_device_ids if i in nvswitch.OFF_HOST_FABRIC_GPUS)
    if off_host:
        return nvswitch.Fabric((), False, f"{found.reason}, but the GPUs "
                               f"({host.pci_id(off_host[0])}) are NVL72 parts whose fabric is "
                               "managed off the node")
    return nvswitch.Fabric((), True, found.reason)


def planned_fabric(facts: HostFacts) -> nvswitch.Fabric:
    """The node's fabric from the facts the planner gathered."""
    return fabric(facts.fabric, tuple(g.device_id for g in facts.gpus))


def fabric_now(root: HostRoot) -> nvswitch.Fabric:
    """The node's fabric read now (the container commands and `installer verify`, which
    gather no plan)."""
    return fabric(host.fabric_hardware(root), tuple(g.device_id for g in host.nvidia_gpus(root)))


# --- the InfiniBand modules ------------------------------------------------------------------


def _module_files(root: HostRoot, kernel: str) -> set[str]:
    """Module names of `kernel` modprobe can load or finds built in (modules.dep and
    modules.builtin, as depmod writes them)."""
    found = set()
    for name in ("modules.dep", "modules.builtin"):
        text = root.read_text(f"/lib/modules/{kernel}/{name}", "") or ""
        for line in text.splitlines():
            path = line.split(":", 1)[0].strip()
            base = path.rsplit("/", 1)[-1]
            match = re.match(r"^(.+)\.ko(\.[a-z]+)?$", base)
            if match:
                found.add(match.group(1).replace("-", "_"))
    return found


def _builtin(root: HostRoot, kernel: str) -> set[str]:
    text = root.read_text(f"/lib/modules/{kernel}/modules.builtin", "") or ""
    return {line.rsplit("/", 1)[-1].split(".ko", 1)[0].replace("-", "_")
            for line in text.splitlines() if line.strip()}


def not_loaded(root: HostRoot, kernel: str) -> list[str]:
    """The IB modules neither in /proc/modules nor built into `kernel`."""
    present = set(kmod.loaded_modules(root)) | _builtin(root, kernel)
    return [name for name in IB_MODULES if name not in present]


def unavailable(root: HostRoot, kernel: str) -> list[str]:
    """The IB modules `kernel`'s module tree lacks (modprobe could not load them)."""
    have = _module_files(root, kernel)
    return [name for name in IB_MODULES if name not in have]


def missing_error(root: HostRoot, kernel: str, absent: list[str], package: str,
                  why: str) -> IbModulesMissing:
    return IbModulesMissing(
        f"{why}: NVLSM needs {', '.join(IB_MODULES)}, but /lib/modules/{kernel} has no "
        f"{', '.join(absent)} (modules.dep): without them NVLSM cannot bind the port, Fabric "
        "Manager exits (NV_WARN_NOTHING_TO_DO) and CUDA fails with error 802",
        hint=f"Install {package} on the node (it holds {', '.join(absent)} for kernel "
        f"{kernel}), then run the installer again.")


def ib_modules_step(ctx: Context, found: Nvlink5) -> Step:
    """Load the missing IB modules with the host's modprobe (refused, before any load, naming
    the package when the kernel lacks one)."""
    root, kernel = ctx.root, ctx.target.kernel

    def satisfied() -> bool:
        return not not_loaded(root, kernel)

    def apply() -> None:
        wanted = not_loaded(root, kernel)
        absent = [name for name in unavailable(root, kernel) if name in wanted]
        if absent:
            raise missing_error(root, kernel, absent, _package(ctx), found.reason)
        for name in wanted:
            result = ctx.runner.run([*kmod.modprobe_base(root), name], check=False,
                                    timeout=120)
            if result.returncode != 0:
                raise IbModuleLoadFailed(
                    f"modprobe {name} exited {result.returncode}: "
                    f"{result.tail().strip() or '(no output)'}")
            log.info("loaded %s (NVLink5 node: NVLSM needs it)", name)

    return Step("load-ib-modules", f"modprobe {', '.join(IB_MODULES)} (NVLSM binds the LPF "
                "port through them)", satisfied, apply)


def _package(ctx: Context) -> str:
    from installer import distros

    return distros.of(ctx.facts.distro).ib_modules_package(ctx.facts.distro, ctx.target.kernel)


def applies(ctx: Context) -> bool:
    return (ctx.config.fabricmanager != "false" and planned_fabric(ctx.facts).needed
            and detect(ctx.facts.fabric.lpf_ports).detected)


def diagnose(root: HostRoot) -> str | None:
    """Why an NVLink5 node's fabric is not complete (IB modules not loaded, no NVLSM running),
    or None when that is not the reason (not an NVLink5 node, or both are fine). Reads sysfs
    and the host's /proc only (any nvlsm process counts: ours, or the host's own service)."""
    from installer.components import processes

    found = detect(host.lpf_ports(root))
    if not found.detected:
        return None
    release = (root.read_text("/proc/sys/kernel/osrelease", "") or "").strip()
    absent = not_loaded(root, release)
    if absent:
        return (f"{found.reason}: {', '.join(absent)} not loaded, so NVLSM cannot bind the "
                "port (install the kernel's InfiniBand modules; `installer plan` names the "
                "package)")
    if not processes.find(root, ("nvlsm",), (PurePosixPath("/"),)):
        return (f"{found.reason}: NVLSM is not running (no nvlsm process); Fabric Manager "
                "cannot route the NVLink5 fabric without it (the fabricmanager container "
                "starts both)")
    return None


class Nvlink5Prerequisites(Part):
    """The NVLink5 prerequisites as a registered component (components.COMPONENTS): said first
    in the plan (why Fabric Manager applies there, what NVLSM needs), its InfiniBand modules
    before any download; its reasons follow Fabric Manager's (they are NVLSM's, which runs
    behind it). No daemon or command of its own."""

    name = "nvlink5"
    stop_order = 1

    def decision(self, ctx: Context) -> Decision:
        found = detect(ctx.facts.fabric.lpf_ports)
        if not found.detected:
            return Decision("nvlink5", "no", found.reason)
        if ctx.config.fabricmanager == "false":
            return Decision("nvlink5", "off", f"{found.reason}; NVIDIA_FABRICMANAGER=false: the "
                            "host runs NVLSM and Fabric Manager")
        if not applies(ctx):
            return Decision("nvlink5", "not managed here", planned_fabric(ctx.facts).reason)
        kernel = ctx.target.kernel
        wanted = not_loaded(ctx.root, kernel)
        absent = [name for name in unavailable(ctx.root, kernel) if name in wanted]
        if not ctx.target.load:
            modules_said = (f"{', '.join(IB_MODULES)} are loaded by a run that loads the driver "
                            "(this one loads nothing)")
        elif absent:
            modules_said = (f"{', '.join(absent)} missing from /lib/modules/{kernel}: install "
                            f"{_package(ctx)} (run fails with ib-modules-missing)")
        elif wanted:
            modules_said = f"{', '.join(wanted)} will be loaded (modprobe)"
        else:
            modules_said = f"{', '.join(IB_MODULES)} loaded"
        shipped_by = ctx.target.ships_user_space("nvlsm")
        if shipped_by is ShippedBy.SOURCE:
            # Fabric Manager comes with the stream's fm profile there (fabricmanager's decision).
            pinned = ctx.config.nvlsm_version
            package = (f"nvlsm-{pinned} (NVIDIA_NVLSM_VERSION)" if pinned
                       else "nvlsm (the host's, else the repo's newest)")
            nvlsm_said = (f"NVLSM: NVIDIA's package {package} from the host's NVIDIA repo (signed, "
                          "as the driver's), its files into versions/<ver>/")
        elif shipped_by is ShippedBy.HOST:
            nvlsm_said = ("NVLSM is not installed by the installer on this source, so the "
                          "fabricmanager container fails with nvlsm-missing: set "
                          "NVIDIA_FABRICMANAGER=false and run NVIDIA's nvlsm package and Fabric "
                          "Manager of the driver's version on the host")
        else:
            from installer.components import nvlsm_archive

            nvlsm_said = "NVLSM: " + nvlsm_archive.digest_source(ctx.config, ctx.target.version)
        return Decision("nvlink5", "yes", f"{found.reason}: NVLSM runs on that port before Fabric "
                        f"Manager, both in the fabricmanager container; {modules_said}; "
                        f"{nvlsm_said}")

    def steps(self, ctx: Context) -> list[Step]:
        if not applies(ctx) or not ctx.target.load:
            return []
        return [ib_modules_step(ctx, detect(ctx.facts.fabric.lpf_ports))]

    def fabric_reasons(self, root: HostRoot, gpus: Sequence[object]) -> list[str]:
        """`diagnose` in the shape of a registered fabric diagnosis: a list of phrases (the GPUs
        NVML reported are not needed: sysfs and /proc say it)."""
        said = diagnose(root)
        return [said] if said else []


COMPONENT = Nvlink5Prerequisites()
