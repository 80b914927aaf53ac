"""Changing the host: Secure Boot, nouveau, the loaded driver, loading, device nodes,
verification, the lock and the install dir's layout."""

from __future__ import annotations

from installer.errors.base import InstallerError


class SecureBootKeysMissing(InstallerError):
    reference = "secure-boot-unsigned"
    exit_code = 32
    default_hint = (
        "Secure Boot rejects unsigned modules: set NVIDIA_MODULE_SIGNING_KEY and "
        "NVIDIA_MODULE_SIGNING_CERT to a key enrolled in the node's MOK list, "
        "or disable Secure Boot."
    )


class NouveauActive(InstallerError):
    reference = "nouveau-active"
    exit_code = 33
    default_hint = (
        "nouveau is blacklisted on the host now; reboot the node and the installer will finish."
    )


class DriverInUse(InstallerError):
    reference = "driver-in-use"
    exit_code = 34
    default_hint = (
        "Stop the processes listed above (or drain the node), then restart the installer pod."
    )


class ModuleLoadFailed(InstallerError):
    reference = "module-load-failed"
    exit_code = 35
    default_hint = "See the kernel log (dmesg) on the node for the reason the module was rejected."


class InstallFailed(InstallerError):
    reference = "install-failed"
    exit_code = 36
    default_hint = "See the nvidia-installer log in the install dir."


class DeviceNodesFailed(InstallerError):
    reference = "device-nodes-failed"
    exit_code = 37
    default_hint = (
        "Check that /dev is the host's /dev (a hostPath volume) and the container is privileged."
    )


class VerificationFailed(InstallerError):
    reference = "verification-failed"
    exit_code = 40
    default_hint = (
        "The driver did not answer as planned; see the report above and dmesg on the node."
    )


class LockTimeout(InstallerError):
    reference = "lock-timeout"
    exit_code = 41
    default_hint = (
        "Another installer holds the host lock; wait for it or raise "
        "NVIDIA_INSTALLER_LOCK_TIMEOUT."
    )


class HostLayoutError(InstallerError):
    reference = "host-layout"
    exit_code = 42
    default_hint = (
        "Check the mounts: ROOT_MOUNT_DIR must hold the host's root and the install dir must be "
        "writable."
    )


class OfedNotReady(InstallerError):
    reference = "ofed-not-ready"
    exit_code = 39
    default_hint = (
        "GPUDirect RDMA's nvidia-peermem loads after MOFED/DOCA-OFED's ib_core: install or "
        "start the host's OFED (or the Network Operator's OFED container) on this node, raise "
        "NVIDIA_GPUDIRECT_OFED_TIMEOUT if it comes up later, or set "
        "NVIDIA_GPUDIRECT_RDMA=false. The driver itself is loaded; the node is marked ready once "
        "a run gets past this step."
    )


class PeermemNeedsOfed(InstallerError):
    reference = "peermem-needs-ofed"
    exit_code = 38
    default_hint = (
        "nvidia-peermem works only with MOFED/DOCA-OFED's ib_core (its peer-memory API); the "
        "kernel's own ib_core has none, and peermem's init fails there. Install DOCA-OFED on "
        "the node, or use DMA-BUF for GPUDirect RDMA (what NVIDIA's GPU Operator recommends over "
        "peermem; it needs no extra module) and set NVIDIA_GPUDIRECT_RDMA=false."
    )


class PeermemLoadFailed(InstallerError):
    reference = "peermem-load-failed"
    exit_code = 49
    default_hint = (
        "nvidia-peermem was built without the OFED it now runs against, or OFED's ib_core "
        "changed since: rebuild the driver's modules with the host's OFED sources in "
        "/usr/src/ofa_kernel (a new `installer run` after OFED's upgrade), and check dmesg."
    )


class PlantedLink(InstallerError):
    reference = "planted-link"
    exit_code = 112
    default_hint = (
        "Something that can write into the install dir, its cache, /run/nvidia-driver-installer "
        "or the host's module and firmware trees (a pod that mounts them) put a symbolic link "
        "where the installer keeps its own files. Nothing was written through it. Find out "
        "who made it, remove the link named above, and run again (docs/download-safety.md, "
        "\"What the installer trusts on the node\")."
    )
