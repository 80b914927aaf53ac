"""What runs beside the driver: Fabric Manager (NVSwitch nodes), nvidia-persistenced, IMEX,
GPUDirect RDMA's nvidia-peermem.

The one door: the plan's decisions and steps (beside the user space, and after the driver's
modules are loaded), which cached downloads to keep, stopping our daemons before a driver is
unloaded, the readiness an NVSwitch node needs, what verify adds and counts against the node,
and the long-running container commands (`installer fabricmanager`, `installer persistenced`,
`installer imex`). Each asks every component registered in `registry.COMPONENTS` (a
`component.Component` each); `lifecycle` keeps our daemons out of the way of an unload.
"""

from __future__ import annotations

from installer.components.lifecycle import (
    driver_held,
    holders,
    not_ours,
    our_daemons,
    pause,
    pause_for,
    paused,
    resume,
)
from installer.components.registry import (
    COMPONENTS,
    commands,
    daemons,
    decisions,
    fabric_diagnosis,
    fabric_required,
    keeps_download,
    loaded_steps,
    named,
    names,
    optional,
    serve,
    steps,
    verify_problems,
    verify_sections,
)

__all__ = [
    "COMPONENTS",
    "commands",
    "daemons",
    "decisions",
    "driver_held",
    "fabric_diagnosis",
    "fabric_required",
    "fabricmanager",
    "fm_archive",
    "gpudirect",
    "holders",
    "keeps_download",
    "loaded_steps",
    "named",
    "names",
    "not_ours",
    "nvlink5",
    "nvlsm_archive",
    "optional",
    "our_daemons",
    "pause",
    "pause_for",
    "paused",
    "resume",
    "serve",
    "steps",
    "supervisor",
    "verify_problems",
    "verify_sections",
]
