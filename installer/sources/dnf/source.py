"""The dnf source's answers to the source protocol: chosen under auto where NVIDIA's
repo is configured. Its plan (`dnf/plan.py`) and steps (`dnf/steps.py`) are imported
only when it is the source (the warm path never loads dnf)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from installer import distros
from installer.config import Config
from installer.errors import ConfigError
from installer.hostroot import HostRoot
from installer.plan import Context, Decision, ShippedBy, Step
from installer.sources.source import Arrival, Groundwork, ManagedElsewhere, Source

if TYPE_CHECKING:
    from installer.host import Distro, HostFacts

NEXT_KERNEL_REASON = (
    "the installer does not prepare it on dnf hosts: with a DKMS stream the host's DKMS builds "
    "for a newly installed kernel itself (its kernel install hook, dkms autoinstall) when "
    "kernel-devel of that kernel is installed; a precompiled stream needs NVIDIA's "
    "kmod-nvidia-<version>-<kernel> package, which only a dnf transaction on the host puts "
    "there, and the installer runs none outside an install"
)


class DnfSource(Source):
    name = "dnf"
    package_source = "dnf"
    # The kmod package owns /lib/modules/<k>/extra; the packages' files fill versions/<ver>.
    stages_module_files = False
    frees_driver_itself = True  # checked before its packages change (dnf.dnf_steps)
    replaces_user_space_before_unload = True

    def ships_user_space(self, component: str, distro: Distro) -> ShippedBy:
        """The distro's packages own the user space, so no redist archive goes beside it: the
        module streams' fm profile brings Fabric Manager of the driver's version and NVIDIA's
        repo NVLSM beside it; without streams (EL10), and for IMEX, none of its packages
        does, and the host's own must."""
        streams = distros.of(distro).module_platform(distro) is not None
        if streams and component in ("fabricmanager", "nvlsm"):
            return ShippedBy.SOURCE
        return ShippedBy.HOST

    def refuse_unless_offered(self, distro: Distro) -> None:
        if not self.offered(distro):
            raise ConfigError(
                f"NVIDIA_DRIVER_SOURCE=dnf needs a RHEL-family host (Rocky, RHEL, AlmaLinux, "
                f"Oracle Linux) or Amazon Linux 2023; "
                f"this host is {distro}",
                hint="Use NVIDIA_DRIVER_SOURCE=auto or runfile on this host.",
            )

    def evidence(self, root: HostRoot, config: Config) -> str | None:
        from installer.sources.dnf import plan

        return plan.repo_evidence(root, config)

    def passed_over(self) -> str:
        return "no NVIDIA dnf repo in /etc/yum.repos.d and NVIDIA_DNF_REPO_URL unset"

    def reason(self, config: Config, facts: HostFacts, passed_over: Sequence[str]) -> str:
        from installer.sources.dnf import commands

        why = ("NVIDIA_DRIVER_SOURCE=dnf" if config.source == self.name else
               f"auto on {facts.distro}: {self.evidence(HostRoot(config.root), config)}")
        how = ("module streams nvidia-driver:<branch>|latest (precompiled, when NVIDIA ships a "
               "kmod for the exact kernel) or <branch>-dkms|-open|latest-dkms|open-dkms (DKMS)"
               if commands.family(facts.distro).module_platform(facts.distro) else
               "packages with a version lock (EL10 has no module streams)")
        return f"{why}; the distro's packages through dnf: {how}"

    def arrival(self, ground: Groundwork) -> Arrival:
        facts = ground.facts
        package = distros.of(facts.distro).headers_package(facts.kernel_release)
        return Arrival([Decision("kernel-headers", package,
                                 "installed through dnf for exactly the target kernel")])

    def decisions(self, ctx: Context, decided: list[Decision]) -> list[Decision]:
        from installer.sources.dnf import plan

        # The stream and version dnf will install replace the catalog's version.
        extra = plan.plan_decisions(ctx)
        topics = {d.topic for d in extra}
        return [d for d in decided if d.topic not in topics] + extra

    def steps(self, ctx: Context) -> list[Step]:
        from installer.sources.dnf import steps

        return steps.dnf_steps(ctx)

    def next_kernel_elsewhere(self, root: HostRoot, kernel: str) -> ManagedElsewhere:
        from installer.sources.dnf import host_state

        return ManagedElsewhere(NEXT_KERNEL_REASON, f"/lib/modules/{kernel}/extra",
                                "nvidia" in host_state.module_files(root, kernel))

    def left_on_host(self) -> str:
        return ("the driver packages installed through dnf stay on the host (dnf owns them): "
                "remove them with `dnf module remove --all nvidia-driver` and "
                "`dnf module reset nvidia-driver` on the host")
