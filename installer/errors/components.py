"""The daemons beside the driver (installer/components): Fabric Manager of the driver's
version on NVSwitch nodes, and nvidia-persistenced."""

from __future__ import annotations

from installer.errors.base import InstallerError


class FabricManagerUnavailable(InstallerError):
    reference = "fabricmanager-unavailable"
    exit_code = 95
    default_hint = (
        "Fabric Manager must be exactly the driver's version: check that NVIDIA publishes "
        "redistrib_<version>.json with a fabricmanager archive for this architecture at "
        "NVIDIA_FABRICMANAGER_REDIST (or copy both into your mirror), or set "
        "NVIDIA_FABRICMANAGER=false when the host runs its own Fabric Manager."
    )


class FabricManagerMismatch(InstallerError):
    reference = "fabricmanager-mismatch"
    exit_code = 96
    default_hint = (
        "The redist tree serves a Fabric Manager archive of another version or layout: fix the "
        "mirror's copy of the archive and of redistrib_<version>.json. The archive was removed "
        "from the cache; no Fabric Manager file was installed and the loaded driver was left "
        "as it was."
    )


class FabricManagerMissing(InstallerError):
    reference = "fabricmanager-missing"
    exit_code = 97
    default_hint = (
        "The install dir has no Fabric Manager of the loaded driver's version: let the "
        "installer initContainer (`installer run`) finish on this NVSwitch node first, and keep "
        "NVIDIA_FABRICMANAGER=auto on both containers."
    )


class FabricManagerFailed(InstallerError):
    reference = "fabricmanager-failed"
    exit_code = 98
    default_hint = (
        "nv-fabricmanager (or, on NVLink5 nodes, NVLSM started before it) kept exiting (its "
        "last lines are above); CUDA fails with error 802 on this node until it runs. Check the "
        "NVSwitch or InfiniBand errors it names, NVFM_CONFIG_* overrides, and that no other "
        "Fabric Manager or subnet manager (a host service) holds the switches or the port."
    )


class PersistencedFailed(InstallerError):
    reference = "persistenced-failed"
    exit_code = 99
    default_hint = (
        "nvidia-persistenced kept exiting or did not start (it logs to syslog only): check "
        "that /dev/nvidia* exist in the container, /var/run/nvidia-persistenced is writable, "
        "and that no other nvidia-persistenced (a host service) runs on the node."
    )


class FabricNotReady(InstallerError):
    reference = "fabric-not-ready"
    exit_code = 46
    default_hint = (
        "CUDA fails on these GPUs (error 802) until their NVLink fabric completes: start what "
        "the message names (Fabric Manager, NVLSM, the IB modules), activate a partition in "
        "shared mode, or on an NVL72 compute tray check the rack's switch trays (NMX-C). "
        "`installer verify --json` shows each GPU's fabric state, status and health; "
        "NVIDIA_INSTALLER_FABRIC_TIMEOUT sets how long the container waits."
    )


class ImexMissing(InstallerError):
    reference = "imex-missing"
    exit_code = 29
    default_hint = (
        "`installer imex` runs nvidia-imex of exactly the loaded driver's version from the "
        "install dir: let the installer initContainer (`installer run`) install it first, with "
        "NVIDIA_IMEX=auto on a GB200/GB300 tray or NVIDIA_IMEX=install elsewhere, on both "
        "containers."
    )


class ImexNodesInvalid(InstallerError):
    reference = "imex-nodes-invalid"
    exit_code = 109
    default_hint = (
        "IMEX needs the IP address of every node of its domain, the same list on each: set "
        "NVIDIA_IMEX_NODES to comma-separated addresses, or to the absolute path of a mounted "
        "ConfigMap key holding one address a line (daemonset/components/imex). The installer "
        "never guesses the list. Nothing was started."
    )


class ImexHostServiceRunning(InstallerError):
    reference = "imex-host-service"
    exit_code = 94
    default_hint = (
        "Two IMEX daemons on one node fight over its port and channels: stop and mask the "
        "host's unit (`systemctl disable --now nvidia-imex && systemctl mask nvidia-imex`) to "
        "let `installer imex` run IMEX, or leave IMEX to the host and remove the imex "
        "container (daemonset/components/imex)."
    )


class ImexFailed(InstallerError):
    reference = "imex-failed"
    exit_code = 93
    default_hint = (
        "nvidia-imex kept exiting or never answered READY (its last lines are above): check "
        "NVIDIA_IMEX_NODES (every address reachable on IMEX's port 50000), that the loaded "
        "driver is the IMEX version, and the channel device (nvidia-caps-imex-channels in "
        "/proc/devices)."
    )
