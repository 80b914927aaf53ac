"""IMEX run by the node (the DRA driver's hostManaged mode): what `installer imex` starts,
watches, restarts and stops. nvidia-imex of exactly the verified driver's version (the plan's
`install-imex` step put it into versions/<ver>/bin) with a config written here: its command
socket on, at the path the DRA driver's kubelet plugin asks (`nvidia-imex-ctl -q --u=<socket>`
inside the driver root), the domain's nodes from NVIDIA_IMEX_NODES. READY from nvidia-imex-ctl
is what its readiness file says.

It is opt-in (the imex container comes with daemonset/components/imex) and the scheduling gate
does not wait for it: the DRA driver asks for READY itself at each channel claim (a claim before
it fails and is retried), and work that needs no IMEX channel must not wait for a rack's domain.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Union

from installer import host, runner
from installer.components import imex
from installer.components.component import Part
from installer.config import Config
from installer.errors import (
    DeviceNodesFailed,
    ImexFailed,
    ImexHostServiceRunning,
    ImexMissing,
    ImexNodesInvalid,
)
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.plan import Context, Decision

if TYPE_CHECKING:  # the supervisor is imported by `installer imex` only
    from installer.components.supervisor import Driver, Idle, Running

log = logging.getLogger(__name__)

NAME = "imex"
DAEMON = "nvidia-imex"
CTL = "nvidia-imex-ctl"
# Where IMEX's files go inside the driver root (the install dir): the DRA driver's default
# socket, /etc/nvidia-imex/imex_ctrl.sock, is one of them.
CONFIG_DIR = PurePosixPath("/etc/nvidia-imex")
# systemd keeps a link per unit that has an invocation (one that runs or is starting).
INVOCATION = "/run/systemd/units/invocation:nvidia-imex.service"
# IMEX's own default command port; the socket is what the DRA driver asks, the port is what
# other tools may.
CMD_PORT = "50005"


def nodes(config: Config, root: HostRoot) -> list[str]:
    """The IMEX domain's addresses from NVIDIA_IMEX_NODES: a comma-separated list, or the
    absolute path of a file (a mounted ConfigMap key, read in this container) with one a line
    (# comments). Raises ImexNodesInvalid for none, an unreadable file or a non-address."""
    value = (config.imex_nodes or "").strip()
    if not value:
        raise ImexNodesInvalid("NVIDIA_IMEX_NODES is not set: IMEX needs its domain's node "
                               "addresses and the installer never guesses them")
    if value.startswith("/"):
        try:
            text = Path(value).read_text()
        except OSError as exc:
            raise ImexNodesInvalid(f"NVIDIA_IMEX_NODES={value}: cannot read it "
                                   f"({exc.strerror or exc})") from None
        items = [line.split("#", 1)[0].strip() for line in text.splitlines()]
        where = value
    else:
        items = [item.strip() for item in value.split(",")]
        where = "NVIDIA_IMEX_NODES"
    found = [item for item in items if item]
    for item in found:
        try:
            ipaddress.ip_address(item)
        except ValueError:
            raise ImexNodesInvalid(f"{where}: {item!r} is not an IP address (IMEX's "
                                   "nodes_config.cfg takes addresses, one a line)") from None
    if not found:
        raise ImexNodesInvalid(f"{where} lists no address")
    if len(set(found)) != len(found):
        raise ImexNodesInvalid(f"{where} lists an address twice: {', '.join(found)}")
    return found


def config_text(socket_path: PurePosixPath | Path, nodes_file: PurePosixPath | Path) -> str:
    """IMEX's config.cfg (read at its start only): in the foreground, so the supervisor sees
    it exit; its command socket on, at `socket_path`; the domain from `nodes_file`."""
    return "".join(f"{key}={value}\n" for key, value in (
        ("DAEMONIZE", "0"),
        ("IMEX_NODE_CONFIG_FILE", str(nodes_file)),
        ("IMEX_CMD_ENABLED", "1"),
        ("IMEX_CMD_PORT", CMD_PORT),
        ("IMEX_CMD_UNIX_DOMAIN_PATH", str(socket_path)),
    ))


def argv(binary: Path, config_file: Path) -> list[str]:
    """As the host's unit runs it: `nvidia-imex -c <config>`."""
    return [str(binary), "-c", str(config_file)]


def query_argv(ctl: Path, socket_path: Path) -> list[str]:
    """What the DRA driver's kubelet plugin asks before it hands out a channel."""
    return [str(ctl), "-q", f"--u={socket_path}"]


def host_service(root: HostRoot, layout: Layout, config: Config) -> str | None:
    """The host's own IMEX, as a phrase, when it runs: an nvidia-imex process whose program is
    not in the install dir, or systemd's invocation of nvidia-imex.service. None otherwise."""
    from installer.components import processes

    ours = (layout.install_host, PurePosixPath(str(layout.install_local)),
            PurePosixPath(str(config.install_dir_container)))
    everyone = processes.find(root, (DAEMON,), (PurePosixPath("/"),))
    mine = {d.pid for d in processes.find(root, (DAEMON,), ours)}
    theirs = [d for d in everyone if d.pid not in mine]
    unit = imex.host_unit(root)
    named = f"the host's {imex.UNIT}" + (f" ({unit})" if unit not in (None, "masked") else "")
    if theirs:
        return f"{named} runs: pid {theirs[0].pid} ({theirs[0].exe})"
    if root.local(INVOCATION).is_symlink():
        return f"{named} runs (systemd: {INVOCATION})"
    return None


class ImexDaemon:
    """nvidia-imex of the verified driver's version, in the foreground."""

    name = NAME

    def __init__(self, config: Config, root: HostRoot) -> None:
        self.config = config
        self.root = root
        self.layout = Layout.from_config(config, root)
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self.commands: runner.Runner = runner.SubprocessRunner()
        self.state = ""  # what nvidia-imex-ctl -q last said
        self.version = ""

    @property
    def config_dir(self) -> Path:
        return self.layout.install_local.joinpath(*CONFIG_DIR.parts[1:])

    @property
    def socket_path(self) -> Path:
        socket = self.config.imex_socket or CONFIG_DIR / "imex_ctrl.sock"
        return self.layout.install_local.joinpath(*socket.parts[1:])

    def plan(self, driver: Driver) -> Union[Idle, Callable[[], Running]]:
        """Idle where IMEX is not wanted; else how to start it. Raises ImexHostServiceRunning,
        ImexNodesInvalid, ImexMissing, DeviceNodesFailed before anything starts."""
        from installer.components.supervisor import Idle

        want, why = imex.wanted(self.config, tuple(g.device_id for g in host.nvidia_gpus(
            self.root)))
        if not want:
            return Idle(why)
        running = host_service(self.root, self.layout, self.config)
        if running:
            raise ImexHostServiceRunning(f"{running}: `installer imex` does not start a second "
                                         "IMEX daemon beside it")
        addresses = nodes(self.config, self.root)
        bin_dir = self.layout.version_dir(driver.version) / "bin"
        if not imex.installed(self.layout, driver.version):
            raise ImexMissing(f"{bin_dir / DAEMON} (IMEX {driver.version}, the loaded driver's "
                              f"version) is not installed: {why}")
        if self.config.imex_channels == "channel0":
            self._channel0(driver.version)
        self.config_dir.mkdir(parents=True, exist_ok=True)
        nodes_file = self.config_dir / "nodes_config.cfg"
        nodes_file.write_text("".join(f"{a}\n" for a in addresses))
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        config_file = self.config_dir / "config.cfg"
        config_file.write_text(config_text(self.socket_path, nodes_file))
        command = argv(bin_dir / DAEMON, config_file)
        environment = {"LD_LIBRARY_PATH": str(self.layout.version_dir(driver.version) / "lib64")}
        self.version = driver.version

        def start() -> Running:
            self.tail.clear()
            self.state = ""
            log.info("starting %s %s for %d node(s), command socket %s: %s", DAEMON,
                     driver.version, len(addresses), self.socket_path, " ".join(command))
            return runner.spawn(command, env=environment, on_line=self._line)

        return start

    def _channel0(self, version: str) -> None:
        """/dev/nvidia-caps-imex-channels/channel0, as nvidia-modprobe makes it (-i 0:1); the
        kernel makes none unless NVreg_CreateImexChannel0=1, and /dev is a tmpfs."""
        if self.root.exists(imex.CHANNEL0):
            return
        binary = self.layout.version_dir(version) / "bin" / "nvidia-modprobe"
        command = [str(binary), "-i", "0:1"]
        result = self.commands.run(command, check=False, timeout=60,
                                   env={"LD_LIBRARY_PATH": str(self.layout.lib_dir)})
        if result.returncode != 0:
            raise DeviceNodesFailed(f"`{' '.join(command)}` failed (IMEX channel 0): "
                                    f"{result.tail().strip()}")
        log.info("created %s (nvidia-modprobe -i 0:1)", imex.CHANNEL0)

    def _line(self, line: str) -> None:
        log.info("%s: %s", DAEMON, line)
        self.tail.append(line)

    def ready(self, running: Running) -> str | None:
        """Once nvidia-imex-ctl -q says READY over the command socket."""
        ctl = self.layout.version_dir(self.version) / "bin" / CTL
        result = self.commands.run(query_argv(ctl, self.socket_path), check=False, timeout=30)
        said = (result.output.strip().splitlines() or [""])[-1].strip()
        if said != self.state:
            log.info("%s -q: %s", CTL, said or f"(nothing; exit {result.returncode})")
            self.state = said
        if result.returncode != 0 or said != "READY":
            return None
        pid = getattr(running, "pid", 0)
        host_socket = self.layout.install_host.joinpath(
            *self.socket_path.relative_to(self.layout.install_local).parts)
        return (f"DRIVER_VERSION={self.version}\nSTATE=running\nPID={pid}\nIMEX=READY\n"
                f"SOCKET={host_socket}\n")

    def failed(self, message: str) -> ImexFailed:
        tail = "\n".join(list(self.tail)[-12:]) or "(it printed nothing)"
        return ImexFailed(f"{message}; its last lines:\n{tail}")


class Imex(Part):
    """IMEX run by the node, as a registered component (components.COMPONENTS): its binaries
    come with the `install-imex` step (components/imex.py), so no steps or download here. Not
    awaited (Part's default): the host-managed daemon is opt-in, so the scheduling gate and the
    node's condition only report its readiness."""

    name = NAME
    command = True
    daemon = DAEMON
    summary = ("Keep nvidia-imex of the verified driver running with its command socket on "
               "(the DRA driver's hostManaged IMEX mode; restarted with backoff); idle where "
               "IMEX is not installed.")

    def decision(self, ctx: Context) -> Decision:
        want, why = imex.wanted(ctx.config, tuple(g.device_id for g in ctx.facts.gpus))
        if not want:
            return Decision("imex-daemon", "not applicable", f"{why}: the imex container, "
                            "where deployed, idles")
        socket = ctx.config.imex_socket or CONFIG_DIR / "imex_ctrl.sock"
        return Decision("imex-daemon", "the imex container, where deployed", "`installer "
                        "imex` (daemonset/components/imex, the DRA driver's hostManaged mode) "
                        "runs nvidia-imex of the driver's version with its command socket at "
                        f"{ctx.layout.install_host}{socket}; the scheduling gate does not wait "
                        "for it")

    def supervised(self, config: Config, root: HostRoot) -> ImexDaemon:
        return ImexDaemon(config, root)


COMPONENT = Imex()
