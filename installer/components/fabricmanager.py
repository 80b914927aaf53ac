"""Fabric Manager on NVSwitch and NVLink5 nodes as a component: the plan's decision and steps
(the archive of exactly the driver's version into versions/<ver>/) and why a fabric is not
complete; the daemon `installer fabricmanager` keeps up is fabricmanager_daemon.py."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from installer import host
from installer.components import fabric, fm_archive, nvlink5, nvswitch, redist
from installer.components.component import Part
from installer.components.fabricmanager_daemon import DAEMON, NAME, FabricManagerDaemon
from installer.config import Config
from installer.dirs import scratch
from installer.hostroot import HostRoot
from installer.plan import Context, Decision, ShippedBy, Step

if TYPE_CHECKING:
    from collections.abc import Sequence

    from installer.verify import GpuInfo

log = logging.getLogger(__name__)


def applies(ctx: Context) -> bool:
    return ctx.config.fabricmanager != "false" and nvlink5.planned_fabric(ctx.facts).needed


def fetch_step(ctx: Context) -> Step:
    layout, version, arch = ctx.layout, ctx.target.version, ctx.facts.arch

    def satisfied() -> bool:
        return (fm_archive.installed(layout, version)
                or fm_archive.cached(ctx.config, layout, version, arch) is not None)

    def apply() -> None:
        fm_archive.fetch(ctx.config, layout, version, arch)

    return Step("fetch-fabricmanager", f"download {fm_archive.archive_name(version, arch)} "
                "(the redist tree's JSON names it and its SHA-256; mirrors, retries, cache)",
                satisfied, apply)


def install_step(ctx: Context) -> Step:
    layout, version, arch = ctx.layout, ctx.target.version, ctx.facts.arch

    def satisfied() -> bool:
        return fm_archive.installed(layout, version)

    def apply() -> None:
        archive = fm_archive.cached(ctx.config, layout, version, arch)
        if archive is None:
            archive = fm_archive.fetch(ctx.config, layout, version, arch)
        with scratch(layout.tmp, within=layout.cache_anchor) as tmp:
            tree = fm_archive.unpack(archive, tmp)
            said = fm_archive.reported_version(ctx.runner, tree / "bin" / DAEMON)
            if said != version:
                raise fm_archive.fail_mismatch(
                    layout, version, arch, f"{archive.name} holds Fabric Manager "
                    f"{said or '(no version)'}, not {version}: it would refuse the driver")
            placed = fm_archive.install(tree, layout.version_dir(version),
                                        fm_archive.config_dir(layout, version), version,
                                        within=layout.install_local)
        log.info("installed Fabric Manager %s into %s: %s", version,
                 layout.version_dir(version), ", ".join(placed))

    return Step("install-fabricmanager", "nv-fabricmanager, its library, config and topology "
                "files into versions/<ver>/ (its --version must be the driver's)",
                satisfied, apply)


class FabricManager(Part):
    """Fabric Manager as a registered component (components.COMPONENTS)."""

    name = NAME
    command = True
    daemon = DAEMON
    awaited = True
    summary = ("Keep nv-fabricmanager of the verified driver running on an NVSwitch node "
               "(restarted with backoff, non-zero exit when it cannot be kept up); idle where "
               "it does not apply.")

    def decision(self, ctx: Context) -> Decision:
        fabric = nvlink5.planned_fabric(ctx.facts)
        if ctx.config.fabricmanager == "false":
            return Decision("fabric-manager", "off", "NVIDIA_FABRICMANAGER=false (the host runs "
                            f"its own Fabric Manager); {fabric.reason}")
        if not fabric.needed:
            return Decision("fabric-manager", "not applicable", fabric.reason)
        t = ctx.target
        shipped_by = t.ships_user_space(NAME)
        if shipped_by is ShippedBy.SOURCE:
            return Decision("fabric-manager", "the stream's fm profile", f"{fabric.reason}: "
                            "CUDA needs Fabric Manager of exactly the driver's version; the "
                            "driver's dnf transaction installs profile nvidia-driver:<stream>/fm "
                            "with NVIDIA's Fabric Manager package of the same version pinned, its "
                            "files go into versions/<ver>/; it runs in the fabricmanager "
                            "container (`installer fabricmanager`)")
        if shipped_by is ShippedBy.HOST:
            return Decision("fabric-manager", "not installed by the installer", f"{fabric.reason}; "
                            f"the {t.source} source on {ctx.facts.distro.id} "
                            f"{ctx.facts.distro.version_id} does not install it (no module "
                            "profiles): run the host's nvidia-fabricmanager service of the same "
                            "version")
        name = fm_archive.archive_name(t.version, ctx.facts.arch)
        return Decision("fabric-manager", name, f"{fabric.reason}: CUDA needs Fabric Manager of "
                        f"exactly {t.version}; from redistrib_{t.version}.json at "
                        f"{', '.join(ctx.config.fabricmanager_redist)} into versions/{t.version}/; "
                        "it runs in the fabricmanager container (`installer fabricmanager`); "
                        "its SHA-256 from "
                        + fm_archive.digest_source(ctx.config, t.version, ctx.facts.arch))

    def steps(self, ctx: Context) -> list[Step]:
        """The runfile source's; the dnf source's come with its packages (sources/dnf/steps.py)."""
        if not applies(ctx) or ctx.target.ships_user_space(NAME) is not ShippedBy.COMPONENT:
            return []
        return [fetch_step(ctx), install_step(ctx)]

    def keeps_download(self, name: str, version: str, arch: str) -> bool:
        return arch in redist.PLATFORMS and name.startswith(
            fm_archive.archive_name(version, arch))

    def supervised(self, config: Config, root: HostRoot) -> FabricManagerDaemon:
        return FabricManagerDaemon(config, root)

    def fabric_reasons(self, root: HostRoot, gpus: Sequence[GpuInfo]) -> list[str]:
        """Why a fabric is not complete, as far as Fabric Manager goes (a fabric.Diagnosis)."""
        ids = tuple(g.device_id for g in host.nvidia_gpus(root))
        off_host = sorted({host.pci_id(i) for i in ids if i in nvswitch.OFF_HOST_FABRIC_GPUS})
        if off_host:
            return [f"the GPUs ({', '.join(off_host)}) are NVL72 parts whose fabric the rack's "
                    "switch trays bring up (NVLSM, Fabric Manager and NMX-C there, not on this "
                    "node)"]
        switches = nvlink5.fabric(host.fabric_hardware(root), ids)
        if switches.needed and not fabric.process_running(root, DAEMON):
            kind = "NVSwitch" if switches.switches else "NVLink5"
            return [f"Fabric Manager ({DAEMON}) is not running on this {kind} node "
                    f"({switches.reason})"]
        return []


COMPONENT = FabricManager()
