"""GPUDirect RDMA (NVIDIA_GPUDIRECT_RDMA=true) as a component: nvidia-peermem loaded after the
driver on a node with a Mellanox PCI device, once MOFED/DOCA-OFED's ib_core is there, and built
against the host's OFED sources; what verify reports of it.

nvidia-peermem's init fails (-EINVAL) unless it was built with the MLNX peer-memory API, which
only MOFED/DOCA-OFED's ib_core exports (`ib_register_peer_memory_client`); the kernel's own
ib_core has none. NCCL and UCX look for /sys/module/nvidia_peermem/version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import NamedTuple

from installer import kmod
from installer.components.component import Part
from installer.config import Config
from installer.errors import ModuleLoadFailed, OfedNotReady, PeermemLoadFailed, PeermemNeedsOfed
from installer.host import MELLANOX_VENDOR_ID, vendor_functions
from installer.hostroot import HostRoot
from installer.plan import Context, Decision, Headers, Step

log = logging.getLogger(__name__)

MODULE = "nvidia-peermem"
VERSION_FILE = "/sys/module/nvidia_peermem/version"
IB_CORE = "/sys/module/ib_core"
# The peer-memory API nvidia-peermem needs: exported by MOFED/DOCA-OFED's ib_core only.
PEER_MEMORY_SYMBOL = "ib_register_peer_memory_client"
# How the host's OFED announces itself: MOFED/DOCA-OFED's ofed_info on the host, or the
# Network Operator's OFED container (its driver tree, and .driver-ready once its modules load).
OFED_INFO = ("/usr/bin/ofed_info", "/usr/sbin/ofed_info")
OFED_CONTAINER = "/run/mellanox/drivers"
OFED_CONTAINER_READY = "/run/mellanox/drivers/.driver-ready"
# Where nvidia-peermem's Kbuild looks for OFED's headers and Module.symvers (absolute paths in
# the build's own view: the build binds the host's at the same place).
OFED_SOURCES = ("/usr/src/ofa_kernel-dkms", "/usr/src/ofa_kernel")
POLL_SECONDS = 5.0


def mellanox_functions(root: HostRoot) -> tuple[str, ...]:
    """PCI functions of vendor 15b3 (ConnectX, BlueField), by address. Reads sysfs only."""
    return tuple(address for address, _ in vendor_functions(root, MELLANOX_VENDOR_ID))


class Ofed(NamedTuple):
    """The host's ib_core: "mofed" (MOFED/DOCA-OFED's, loaded and ready), "mainline" (the
    kernel's own, and no OFED announced), or "waiting" (none yet, or OFED still loading)."""

    state: str
    reason: str


def ofed(root: HostRoot) -> Ofed:
    """What the host's ib_core is now. Reads /sys/module, /proc/kallsyms, the OFED markers."""
    announced = [p for p in (*OFED_INFO, OFED_CONTAINER) if root.exists(p)]
    if not root.exists(IB_CORE):
        return Ofed("waiting", "ib_core is not loaded" + (
            f" (OFED: {', '.join(announced)})" if announced else " and no OFED is installed"))
    if root.exists(OFED_CONTAINER) and not root.exists(OFED_CONTAINER_READY):
        return Ofed("waiting", f"the OFED container has not loaded its modules yet (no "
                    f"{OFED_CONTAINER_READY})")
    if _exports_peer_memory(root):
        return Ofed("mofed", f"ib_core exports {PEER_MEMORY_SYMBOL} (MOFED/DOCA-OFED)")
    if announced:
        return Ofed("waiting", f"the loaded ib_core is the kernel's own, while OFED is "
                    f"installed ({', '.join(announced)}): waiting for OFED's modules")
    return Ofed("mainline", f"the loaded ib_core is the kernel's own (no {PEER_MEMORY_SYMBOL} "
                "in /proc/kallsyms) and no MOFED/DOCA-OFED is installed")


def _exports_peer_memory(root: HostRoot) -> bool:
    try:
        with open(root.local("/proc/kallsyms"), encoding="ascii", errors="replace") as symbols:
            return any(line.split()[2:3] == [PEER_MEMORY_SYMBOL] for line in symbols)
    except OSError:
        return False


def ofed_sources(root: HostRoot) -> tuple[PurePosixPath, ...]:
    """The host's OFED source trees that nvidia-peermem's Kbuild reads, where present."""
    return tuple(PurePosixPath(p) for p in OFED_SOURCES if root.local(p).is_dir())


def with_ofed_sources(ctx: Context, headers: Headers) -> Headers:
    """`headers` with the host's OFED sources bound into the build at their own paths, where
    GPUDirect RDMA is asked for and the build runs beside a host root (on a bare host the build
    sees them already)."""
    if not ctx.config.gpudirect_rdma or ctx.root.is_bare or headers.in_container \
            or headers.unpacked_root is not None:
        return headers
    trees = tuple(t for t in ofed_sources(ctx.root) if t not in headers.binds)
    return headers._replace(binds=headers.binds + trees) if trees else headers


def loaded(root: HostRoot) -> str | None:
    """nvidia_peermem's version as NCCL and UCX read it, when it is loaded."""
    text = root.read_text(VERSION_FILE)
    if text is not None:
        return text.strip() or "unknown"
    return "unknown" if root.exists("/sys/module/nvidia_peermem") else None


def wait_for_ofed(root: HostRoot, timeout: float, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> Ofed:
    """MOFED/DOCA-OFED's ib_core, waited for at most `timeout` seconds. Raises PeermemNeedsOfed
    (the kernel's own ib_core, no OFED installed: nothing to wait for) or OfedNotReady."""
    deadline = clock() + timeout
    said = ""
    while True:
        state = ofed(root)
        if state.state == "mofed":
            return state
        if state.state == "mainline":
            raise PeermemNeedsOfed(f"{MODULE} cannot work on this node: {state.reason}")
        if state.reason != said:
            log.info("GPUDirect RDMA: %s", state.reason)
            said = state.reason
        if clock() >= deadline:
            raise OfedNotReady(f"no MOFED/DOCA-OFED ib_core after {timeout:.0f} s: "
                               f"{state.reason}")
        sleep(min(POLL_SECONDS, max(deadline - clock(), 0.0)))


def load_step(ctx: Context, wait: Callable[[HostRoot, float], Ofed] = wait_for_ofed) -> Step:
    """After the driver's modules: nvidia-peermem, as the driver's others are loaded."""

    def wanted() -> bool:
        return ctx.config.gpudirect_rdma and bool(mellanox_functions(ctx.root))

    def satisfied() -> bool:
        return not wanted() or loaded(ctx.root) is not None

    def apply() -> None:
        state = wait(ctx.root, ctx.config.ofed_timeout)
        log.info("GPUDirect RDMA: %s: loading %s", state.reason, MODULE)
        t = ctx.target
        request = kmod.LoadRequest(
            kernel=t.kernel, via_modprobe=kmod.modules_dir_writable(ctx.root, t.kernel),
            module_dir=ctx.layout.module_build(t.version, t.kernel, t.flavour),
            user_args={kmod.kernel_name(MODULE): ctx.config.module_args_for(MODULE)})
        try:
            kmod.load_module(ctx.root, ctx.runner, request, MODULE)
        except ModuleLoadFailed as exc:
            raise PeermemLoadFailed(exc.message) from exc

    return Step("load-peermem", f"GPUDirect RDMA: {MODULE} after MOFED/DOCA-OFED's ib_core "
                "(NVIDIA_GPUDIRECT_RDMA, a Mellanox device)", satisfied, apply)


def report(config_rdma: bool, root: HostRoot) -> tuple[dict[str, object] | None, str | None]:
    """What `installer verify --json` says of GPUDirect RDMA (None where it is neither asked
    for nor loaded), and a problem when it is asked for, a Mellanox device is present and
    nvidia_peermem is not loaded. Read-only."""
    version = loaded(root)
    if not config_rdma and version is None:
        return None, None
    functions = mellanox_functions(root)
    state = ofed(root)
    section: dict[str, object] = {
        "requested": config_rdma, "mellanox_functions": list(functions),
        "ib_core": state.state, "peermem_version": version, "version_file": VERSION_FILE}
    if config_rdma and functions and version is None:
        return section, (f"GPUDirect RDMA is asked for and a Mellanox device is present, but "
                         f"{MODULE} is not loaded ({VERSION_FILE} is absent; {state.reason})")
    return section, None


class GpudirectRdma(Part):
    """Its decision, its load after the driver's modules, and its verify section and problem."""

    name = "gpudirect-rdma"

    def decision(self, ctx: Context) -> Decision:
        if not ctx.config.gpudirect_rdma:
            return Decision("gpudirect-rdma", "off", "NVIDIA_GPUDIRECT_RDMA=false: nvidia-peermem "
                            "is not loaded (DMA-BUF needs no module)")
        found = mellanox_functions(ctx.root)
        if not found:
            return Decision("gpudirect-rdma", "not applicable", "no Mellanox PCI device (15b3) "
                            "in /sys/bus/pci/devices")
        sources = ofed_sources(ctx.root)
        built = (f"built against the host's OFED sources ({', '.join(map(str, sources))})"
                 if sources else "no OFED sources in /usr/src/ofa_kernel on the host: peermem is "
                 "built without the peer-memory API and will not load")
        return Decision("gpudirect-rdma", MODULE, f"{len(found)} Mellanox function(s) ({found[0]}"
                        f"{', ...' if len(found) > 1 else ''}): {MODULE} after the driver, once "
                        f"MOFED/DOCA-OFED's ib_core is loaded (waiting up to "
                        f"{ctx.config.ofed_timeout:.0f} s); {built}")

    def loaded_steps(self, ctx: Context) -> list[Step]:
        """Its step, where NVIDIA_GPUDIRECT_RDMA asks for it (every run that loads the driver, so
        an upgrade, which unloads nvidia_peermem first, loads it again)."""
        return [load_step(ctx)] if ctx.config.gpudirect_rdma else []

    def verify_section(self, config: Config, root: HostRoot) -> dict[str, object]:
        section, _ = report(config.gpudirect_rdma, root)
        return {"gpudirect_rdma": section} if section is not None else {}

    def verify_problems(self, config: Config, root: HostRoot) -> list[str]:
        _, problem = report(config.gpudirect_rdma, root)
        return [problem] if problem is not None else []


COMPONENT = GpudirectRdma()
