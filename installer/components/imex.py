"""IMEX for multi-node NVLink (GB200/GB300 NVL72 trays): nvidia-imex and nvidia-imex-ctl of
exactly the driver's version from the driver's redist tree into versions/<ver>/bin, where the
DRA driver's compute-domain daemon finds driver binaries; the host's nvidia-imex.service."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path, PurePosixPath

from installer import host, safefs
from installer.components import nvswitch, redist
from installer.components.component import Part
from installer.config import Config
from installer.dirs import mark_complete, scratch
from installer.errors import ImexMismatch, ImexUnavailable
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.plan import Context, Decision, ShippedBy, Step

log = logging.getLogger(__name__)

COMPONENT_KEY = "imex"
BINARIES = ("nvidia-imex", "nvidia-imex-ctl")
MARKER = ".imex-version"
# The host's own unit: it must not serve IMEX while the DRA driver's daemon does.
UNIT = "nvidia-imex.service"
UNIT_DIRS = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
# What the DRA driver's kubelet plugin needs of the loaded driver.
CHANNELS_DEVICE = "nvidia-caps-imex-channels"
CHANNEL0 = "/dev/nvidia-caps-imex-channels/channel0"


def wanted(config: Config, gpu_device_ids: tuple[int, ...]) -> tuple[bool, str]:
    """Whether to install IMEX, and why: NVIDIA_IMEX=install, or auto on GB200/GB300 trays."""
    if config.imex == "false":
        return False, "NVIDIA_IMEX=false"
    if config.imex == "install":
        return True, "NVIDIA_IMEX=install"
    trays = sorted(i for i in gpu_device_ids if i in nvswitch.OFF_HOST_FABRIC_GPUS)
    if trays:
        return True, (f"GPUs 10de:{trays[0]:04x} are GB200/GB300 NVL72 parts: multi-node NVLink "
                      "needs IMEX of the driver's version")
    return False, "no GB200/GB300 GPU (NVIDIA_IMEX=install installs it anyway)"


def host_unit(root: HostRoot) -> str | None:
    """The host's nvidia-imex.service: None (none), "masked", or where it is."""
    for directory in UNIT_DIRS:
        path = root.local(f"{directory}/{UNIT}")
        if path.is_symlink() and str(path.readlink()) == "/dev/null":
            return "masked"
        if path.exists():
            return f"{directory}/{UNIT}"
    return None


def installed(layout: Layout, version: str) -> bool:
    bin_dir = layout.version_dir(version) / "bin"
    try:
        text = (bin_dir / MARKER).read_text()
    except OSError:
        return False
    return (re.fullmatch(re.escape(version) + r"\n[0-9a-f]{64}\n", text) is not None
            and all((bin_dir / name).is_file() for name in BINARIES))


def parse_entry(data: bytes, version: str, arch: str, where: str) -> redist.Listed:
    """The imex entry of redistrib_<version>.json for `arch` (its archive's name varies by
    release: taken from the JSON, under imex/). Raises ImexUnavailable (none listed) or
    ImexMismatch (another version, or a path outside the tree)."""

    def archive(listed: str, path: PurePosixPath) -> str | None:
        if (path.parts[:1] == (COMPONENT_KEY,) and path.name.endswith(".tar.xz")
                and listed in path.name):
            return None
        return f"an imex archive of {listed} under imex/"

    return redist.parse(data, COMPONENT_KEY, arch, where, absent=ImexUnavailable,
                        mismatch=ImexMismatch, archive=archive, version=version,
                        because=": IMEX aborts on a driver of another version")


def fetch(config: Config, layout: Layout, version: str, arch: str) -> Path:
    """The archive the first redistrib JSON (trusted-first) that lists imex of `version` names
    (a JSON without it, or of another version, is passed over like a 404), into the download cache,
    verified as Fabric Manager's is (installer.components.redist: the digests file, or that
    JSON over TLS from a trusted origin; a mirror's JSON vouches for nothing)."""
    found = redist.lookup(config, version,
                          lambda data, where: parse_entry(data, version, arch, where),
                          pass_over=(ImexUnavailable, ImexMismatch))
    if found.listed is None:
        mismatched = any(isinstance(exc, ImexMismatch) for exc in found.passed_over)
        error = ImexMismatch if mismatched else ImexUnavailable
        raise error(f"no base of the redist tree lists imex {version} for {arch}: tried "
                    f"{found.tried}")
    fetched = redist.fetch(config, layout, found.listed, config.fabricmanager_redist)
    log.info("IMEX %s: %s (sha256 %s, verified by %s)", version, found.listed.name,
             fetched.sha256, fetched.verified_by)
    return Path(fetched.path)


def install(archive: Path, work: Path, layout: Layout, version: str) -> list[str]:
    """nvidia-imex and nvidia-imex-ctl of the extracted archive (confined to its top
    directory) into versions/<ver>/bin; the marker (version, archive SHA-256) last. Raises
    ArchiveUnsafe or ImexMismatch."""
    from installer.delivery import extract, file_sha256

    tree = extract(archive, work, archive.name[: -len(".tar.xz")])
    bin_dir = layout.version_dir(version) / "bin"
    sources = {}
    for name in BINARIES:
        source = next((p for p in (tree / "bin" / name, tree / "sbin" / name) if p.is_file()),
                      None)
        if source is None:
            raise ImexMismatch(f"{archive.name} has no bin/{name}")
        sources[name] = source
    for name, source in sources.items():
        # The file itself, as copy2 took it (a link inside the unpacked tree is resolved).
        safefs.place_copy(Path(os.path.realpath(source)), bin_dir / name,
                          anchor=layout.install_local)
    mark_complete(bin_dir, f"{version}\n{file_sha256(archive)}\n", MARKER)
    return [f"bin/{name}" for name in BINARIES]


def channel(root: HostRoot) -> dict[str, object]:
    """What `verify --json` reports of IMEX channels: the driver's char device major for
    nvidia-caps-imex-channels in /proc/devices, and whether channel0's node exists."""
    major = None
    for line in (root.read_text("/proc/devices", "") or "").splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] == CHANNELS_DEVICE and fields[0].isdigit():
            major = int(fields[0])
    return {"device": CHANNELS_DEVICE, "major": major, "channel0": CHANNEL0,
            "channel0_present": root.exists(CHANNEL0)}


class ImexChannel(Part):
    """IMEX's binaries and channel as a registered component (components.COMPONENTS): its
    decision and step, and the channel device in `installer verify --json`. Its daemon is the
    DRA driver's, or the one `installer imex` keeps up (components/imexd.py)."""

    name = "imex-channel"

    def decision(self, ctx: Context) -> Decision:
        want, why = wanted(ctx.config, tuple(g.device_id for g in ctx.facts.gpus))
        if not want:
            return Decision("imex", "not installed", why)
        unit = host_unit(ctx.root)
        service = {None: "the host has no nvidia-imex.service",
                   "masked": "the host's nvidia-imex.service is masked"}.get(
            unit, f"the host's {unit} is left alone: mask it (systemctl mask nvidia-imex) where "
            "the DRA driver's compute-domain daemon runs IMEX")
        where = (f"into versions/{ctx.target.version}/bin (the DRA driver finds them with "
                 f"nvidiaDriverRoot={ctx.layout.install_host})")
        t = ctx.target
        if t.ships_user_space(COMPONENT_KEY) is not ShippedBy.COMPONENT:
            package = (f"nvidia-imex-{t.version}" if t.branch >= 580 else
                       f"nvidia-imex-{t.branch}-{t.version}")
            return Decision("imex", "not installed by the installer", f"{why}; the {t.source} "
                            f"source does not install it: install NVIDIA's {package} package of "
                            f"the driver's version; {service}")
        return Decision("imex", f"nvidia-imex {t.version}", f"{why}: nvidia-imex and "
                        f"nvidia-imex-ctl of exactly {t.version} from the imex entry of "
                        f"redistrib_{t.version}.json at "
                        f"{', '.join(ctx.config.fabricmanager_redist)} {where}; {service}")

    def steps(self, ctx: Context) -> list[Step]:
        if ctx.target.ships_user_space(COMPONENT_KEY) is not ShippedBy.COMPONENT or not wanted(
                ctx.config, tuple(g.device_id for g in ctx.facts.gpus))[0]:
            return []
        layout, version, arch = ctx.layout, ctx.target.version, ctx.facts.arch

        def satisfied() -> bool:
            return installed(layout, version)

        def apply() -> None:
            archive = fetch(ctx.config, layout, version, arch)
            with scratch(layout.tmp, within=layout.cache_anchor) as tmp:
                placed = install(archive, tmp, layout, version)
            log.info("installed IMEX %s: %s", version, ", ".join(placed))

        return [Step("install-imex", "nvidia-imex and nvidia-imex-ctl of the driver's version "
                     "into versions/<ver>/bin (the redistrib JSON names the archive)", satisfied,
                     apply)]

    def verify_section(self, config: Config, root: HostRoot) -> dict[str, object]:
        """The channel device where IMEX is installed or the driver has the device."""
        found = channel(root)
        gpus = tuple(g.device_id for g in host.nvidia_gpus(root))
        if wanted(config, gpus)[0] or found["major"] is not None:
            return {COMPONENT_KEY: found}
        return {}


COMPONENT = ImexChannel()
