"""`installer fabricmanager`: nv-fabricmanager of the verified driver kept up in the foreground
(with NVLSM beside it on an NVLink5 node), and the fabricmanager.cfg it runs with."""

from __future__ import annotations

import collections
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Union

from installer import host, runner
from installer.components import fabric, fm_archive, nvlink5
from installer.config import Config
from installer.errors import ConfigError, FabricManagerFailed, FabricManagerMissing
from installer.hostroot import HostRoot
from installer.layout import Layout

if TYPE_CHECKING:  # the supervisor is imported by `installer fabricmanager` only
    from collections.abc import Sequence

    from installer.components.supervisor import Driver, Idle, Running
    from installer.verify import GpuInfo

log = logging.getLogger(__name__)

NAME = "fabricmanager"
DAEMON = "nv-fabricmanager"
# NVIDIA's driver container takes fabricmanager.cfg overrides from NVFM_CONFIG_<KEY>=<value>.
CONFIG_PREFIX = "NVFM_CONFIG_"
# The supervisor keeps nv-fabricmanager in the foreground (it must see it die) and its log on
# stderr (an empty LOG_FILE_NAME: kubectl logs shows it).
FORCED = {"DAEMONIZE": "0", "LOG_FILE_NAME": ""}
# What nv-fabricmanager logs once every NVSwitch routes GPU NVLink traffic.
CONFIGURED = "Successfully configured all the available NVSwitches"
NVML_EVERY = 3.0  # seconds between fabric checks while it is not ready
_KEY = r"^[A-Z][A-Z0-9_]*$"
_CONTROL = r"[\x00-\x1f\x7f]"


# --- the config nv-fabricmanager runs with ---------------------------------------------------


def overrides(env: Mapping[str, str], topology_dir: Path) -> dict[str, str]:
    """fabricmanager.cfg keys to set: NVFM_CONFIG_<KEY> from the environment, the topology
    files of this install, and the keys the supervisor needs. Raises ConfigError for a key or
    value that is not one line of KEY=value, or for a key the supervisor owns."""
    values = {"TOPOLOGY_FILE_PATH": str(topology_dir)}
    for variable, value in sorted(env.items()):
        if not variable.startswith(CONFIG_PREFIX):
            continue
        key = variable[len(CONFIG_PREFIX):]
        if not re.match(_KEY, key) or re.search(_CONTROL, value):
            raise ConfigError(f"{variable}: fabricmanager.cfg takes KEY=value lines of "
                              "upper-case keys and one-line values")
        if key in FORCED:
            raise ConfigError(f"{variable} cannot be set: `installer fabricmanager` keeps "
                              "nv-fabricmanager in the foreground with its log on stderr",
                              hint=f"Remove {variable} from the fabricmanager container.")
        values[key] = value
    values.update(FORCED)
    return values


def render(text: str, values: Mapping[str, str]) -> str:
    """`text` (fabricmanager.cfg) with each key of `values` set: its line replaced in place,
    or appended when the file has none."""
    lines = text.splitlines()
    seen = set()
    for index, line in enumerate(lines):
        key = line.split("=", 1)[0].strip()
        if "=" in line and not line.lstrip().startswith("#") and key in values:
            lines[index] = f"{key}={values[key]}"
            seen.add(key)
    lines += [f"{key}={value}" for key, value in values.items() if key not in seen]
    return "\n".join(lines) + "\n"


def shared_nvswitch(config_text: str) -> bool:
    """Whether fabricmanager.cfg says FABRIC_MODE=1 (shared NVSwitch multitenancy)."""
    for line in config_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "FABRIC_MODE" and not line.lstrip().startswith("#"):
            return value.strip() == "1"
    return False


def argv(binary: Path, config_file: Path) -> list[str]:
    return [str(binary), "-c", str(config_file)]


# --- `installer fabricmanager` ---------------------------------------------------------------


class FabricManagerDaemon:
    """nv-fabricmanager of the verified driver's version, in the foreground."""

    name = NAME

    def __init__(self, config: Config, root: HostRoot,
                 env: Mapping[str, str] | None = None, run_dir: Path | None = None) -> None:
        self.config = config
        self.root = root
        self.env = dict(os.environ if env is None else env)
        self.work = Path(tempfile.mkdtemp(prefix="installer-fabricmanager-"))
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self.configured = False
        self.layout = Layout.from_config(config, root)
        # Every component's reasons why a fabric is not complete: set by the registry, which
        # knows them all (components.registry.serve).
        self.diagnose: Callable[[Sequence[GpuInfo]], list[str]] = lambda gpus: []
        self.wait = fabric.FabricWait(self.layout.install_local, root,
                                      lambda gpus: self.diagnose(gpus), config.fabric_timeout,
                                      every=NVML_EVERY)
        # Shared NVSwitch mode (FABRIC_MODE=1): NVIDIA's driver container resets the GPUs once
        # Fabric Manager is up (`nvidia-smi -r`), after each start.
        self.reset_pending = False
        self.shared_mode = False
        self.pair = False  # NVLSM beside it (an NVLink5 node)
        self.commands: runner.Runner = runner.SubprocessRunner()
        self.library_env: dict[str, str] = {}  # LD_LIBRARY_PATH of the driver's user space
        # NVLSM's pid file and the socket it shares with Fabric Manager, in this container.
        self.run_dir = run_dir or Path(nvlink5.FM_RUN_DIR)

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def plan(self, driver: Driver) -> Union[Idle, Callable[[], Running]]:
        if self.config.fabricmanager == "false":
            return self._watch("NVIDIA_FABRICMANAGER=false")
        hardware = host.fabric_hardware(self.root)  # read once for both questions below
        switches = nvlink5.fabric(hardware, tuple(g.device_id for g in host.nvidia_gpus(
            self.root)))
        if not switches.needed:
            return self._watch(switches.reason)
        version = driver.version
        if not fm_archive.installed(self.layout, version):
            raise FabricManagerMissing(
                f"{switches.reason}, but {fm_archive.binary(self.layout, version)} (Fabric "
                f"Manager {version}, the loaded driver's version) is not installed")
        source = fm_archive.config_dir(self.layout, version)
        config_file = self.work / "fabricmanager.cfg"
        config_file.write_text(render((source / "fabricmanager.cfg").read_text(),
                                      overrides(self.env, source)))
        self.shared_mode = shared_nvswitch(config_file.read_text())
        command = argv(fm_archive.binary(self.layout, version), config_file)
        environment = {"LD_LIBRARY_PATH": str(self.layout.version_dir(version) / "lib64")}
        self.library_env = environment
        found = nvlink5.detect(hardware.lpf_ports)
        self.pair = found.detected
        if found.detected:  # NVLSM first, on the port Fabric Manager then manages through
            from installer.components import nvlsm

            log.info("%s: NVLSM, then %s", found.reason, DAEMON)
            pair = nvlsm.pair_start(self.layout, version, found,
                                    fm_archive.binary(self.layout, version), config_file,
                                    environment, self.run_dir, self._line)

            def start_pair() -> Running:
                self.configured = False
                self.wait.restart()
                self.reset_pending = self.shared_mode
                self.tail.clear()
                return pair()

            return start_pair

        def start() -> Running:
            self.configured = False
            self.wait.restart()
            self.reset_pending = self.shared_mode
            self.tail.clear()
            log.info("starting %s %s: %s", DAEMON, version, " ".join(command))
            return runner.spawn(command, env=environment, on_line=self._line)

        return start

    def _line(self, line: str) -> None:
        # On NVLink5 nodes NVLSM's lines come here too, already prefixed with its name.
        log.info("%s", line if line.startswith("nvlsm: ") else f"{DAEMON}: {line}")
        self.tail.append(line)
        if CONFIGURED in line:
            self.configured = True

    def _watch(self, reason: str) -> Union[Idle, Callable[[], Running]]:
        """Nothing of ours to run: idle where no GPU can report a fabric; else wait for the
        fabric all the same (managed off the node, or by the host), the file written only
        once it completed."""
        from installer.components.supervisor import Idle

        if not fabric.may_report_fabric(self.root):
            return Idle(reason)

        def start() -> Running:
            self.wait.restart()
            log.info("%s: %s; waiting for the GPUs' NVLink fabric", NAME, reason)
            return fabric.FabricWatch(reason)

        return start

    def ready(self, running: Running) -> str | None:
        """Once it said the switches are configured (where it runs) and every GPU that
        reports an NVLink fabric completed it (NVML, asked every NVML_EVERY seconds in a
        child process). Raises FabricNotReady past NVIDIA_INSTALLER_FABRIC_TIMEOUT where
        nothing of ours runs (fabric.FabricWait)."""
        if isinstance(running, fabric.FabricWatch):
            states = self.wait.check(runner.SubprocessRunner(), ours_running=False)
            if states is None:
                return None
            if "completed" not in states.split(","):
                return (f"DRIVER_VERSION={self._version()}\nSTATE=not-applicable\n"
                        f"REASON={running.reason}; no GPU reports an NVLink fabric\n")
            return (f"DRIVER_VERSION={self._version()}\nSTATE=fabric-complete\n"
                    f"REASON={running.reason}\nFABRIC={states}\n")
        # Fabric Manager's log on NVLink5 nodes is not documented: there NVML's fabric state
        # alone decides.
        if not self.configured and not self.pair:
            return None
        # FABRIC_MODE=1: reset once Fabric Manager has the switches (its log says so), or on
        # NVLink5, whose log is not documented, once NVML shows it registering the GPUs.
        if self.reset_pending and (self.configured or fabric.registering(self.wait.last)):
            self.reset_pending = False
            self._reset_gpus()
            return None  # the fabric is read again after the reset
        states = self.wait.check(runner.SubprocessRunner(), ours_running=True)
        if states is None:
            return None
        pid = getattr(running, "pid", 0)  # nv-fabricmanager's, alone or beside NVLSM
        return (f"DRIVER_VERSION={self._version()}\nSTATE=running\nPID={pid}\n"
                f"FABRIC={states}\n")

    def _reset_gpus(self) -> None:
        smi = self.layout.bin_dir / "nvidia-smi"
        # The container's ld cache does not know the install dir: nvidia-smi finds its
        # libnvidia-ml there through LD_LIBRARY_PATH, as nv-fabricmanager does.
        result = self.commands.run([str(smi), "-r"], check=False, timeout=300,
                                   env=self.library_env)
        if result.returncode != 0:  # a GPU in use is not reset; the partition still works
            log.warning("FABRIC_MODE=1: nvidia-smi -r exited %d: %s", result.returncode,
                        result.tail().strip())
        else:
            log.info("FABRIC_MODE=1: reset the GPUs after Fabric Manager came up (nvidia-smi -r)")

    def _version(self) -> str:
        driver = host.loaded_driver(self.root)
        return (driver.version if driver else None) or "unknown"

    def failed(self, message: str) -> FabricManagerFailed:
        # The last lines only: the error it exits with is last, and the termination message
        # keeps 4 KiB (kubectl logs has the rest).
        tail = "\n".join(list(self.tail)[-12:]) or "(it printed nothing)"
        return FabricManagerFailed(f"{message}; its last lines:\n{tail}")
