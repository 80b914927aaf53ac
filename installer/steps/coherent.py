"""Coherent GPU memory on Grace-coupled GPUs: `NVreg_CoherentGPUMemoryMode=driver` for the
nvidia module from R580 on, unless the operator's module options set the key themselves."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Optional

from installer.host import PciGpu, pci_id
from installer.hostroot import HostRoot
from installer.plan import Decision

if TYPE_CHECKING:
    from installer.config import Config

PARAM = "NVreg_CoherentGPUMemoryMode"
VALUE = "driver"
# CDMM exists from R580 (580.65.06's notes); before it the key is unknown to the module.
FIRST_BRANCH = 580
# GPUs beside a Grace CPU over NVLink-C2C, whose memory the kernel would otherwise online as
# NUMA nodes: GH200, GB200, GB300 (by PCI device id).
GRACE_COUPLED = {0x2342: "GH200", 0x2348: "GH200", 0x2941: "GB200", 0x31C2: "GB300",
                 0x31C3: "GB300"}
# modprobe.d(5)'s directories: modprobe reads all of them on a bare host; with a mounted root
# the installer hands modprobe the host's /etc/modprobe.d only (modules.modprobe_base).
_BARE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/local/lib/modprobe.d",
              "/usr/lib/modprobe.d", "/lib/modprobe.d")
_OPTION = re.compile(r"^\s*options\s+nvidia\s+(.*)$")
# What /proc/driver/nvidia/params says once the module took the key.
PARAMS_FILE = "/proc/driver/nvidia/params"
_PARAMS_LINE = re.compile(r'^CoherentGPUMemoryMode:\s*"([^"]*)"\s*$', re.MULTILINE)


class Coherent(NamedTuple):
    """What the nvidia module gets for coherent memory, and the plan's line about it."""

    args: tuple[str, ...]
    decision: Decision

    @property
    def expected(self) -> Optional[str]:
        """The mode the loaded module must report when the installer set it."""
        return VALUE if self.args else None


def decide(config: Config, root: HostRoot, gpus: Sequence[PciGpu], branch: int) -> Coherent:
    """Reads the host's modprobe.d only. `driver` for a Grace-coupled GPU on R580 or newer,
    unless NVIDIA_MODULE_ARGS or an `options nvidia` line of modprobe.d sets the key."""
    grace = sorted({f"{GRACE_COUPLED[g.device_id]} ({pci_id(g.device_id)})"
                    for g in gpus if g.device_id in GRACE_COUPLED})
    if not grace:
        return Coherent((), Decision("coherent-memory", "not applicable",
                                     "no Grace-coupled GPU (GH200, GB200, GB300)"))
    if branch < FIRST_BRANCH:
        return Coherent((), Decision("coherent-memory", "not set", f"R{branch} predates "
                                     f"{PARAM} (R{FIRST_BRANCH} on): GPU memory is onlined as "
                                     "NUMA nodes"))
    operator = operator_setting(config, root)
    if operator is not None:
        return Coherent((), Decision("coherent-memory", "the operator's",
                                     f"{operator[0]} sets {PARAM}={operator[1]}"))
    return Coherent((f"{PARAM}={VALUE}",), Decision(
        "coherent-memory", f"{PARAM}={VALUE}",
        f"{', '.join(grace)} on R{branch}: driver-managed coherent memory keeps GPU memory out "
        "of the kernel's NUMA nodes, as NVIDIA's driver container sets it (set the key in "
        "NVIDIA_MODULE_ARGS or modprobe.d for another mode)"))


def operator_setting(config: Config, root: HostRoot) -> Optional[tuple[str, str]]:
    """Where the operator set the key and its value: NVIDIA_MODULE_ARGS first, then the
    modprobe.d files modprobe reads (the first in its order of directories and names)."""
    for arg in config.module_args_for("nvidia"):
        key, _, value = arg.partition("=")
        if key == PARAM:
            return "NVIDIA_MODULE_ARGS", value
    for directory in _BARE_DIRS if root.is_bare else _BARE_DIRS[:1]:
        local = root.local(directory)
        try:
            names = sorted(n for n in os.listdir(local) if n.endswith(".conf"))
        except OSError:
            continue
        for name in names:
            try:
                text = (local / name).read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                match = _OPTION.match(line)
                for option in (match.group(1).split() if match else ()):
                    key, _, value = option.partition("=")
                    if key == PARAM:
                        return f"{directory}/{name}", value
    return None


def loaded_mode(root: HostRoot) -> Optional[str]:
    """The mode the loaded nvidia module reports (None: no such line, before R580)."""
    match = _PARAMS_LINE.search(root.read_text(PARAMS_FILE) or "")
    return match.group(1) if match else None
