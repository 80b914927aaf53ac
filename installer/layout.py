"""Where everything the installer owns lives on the host, as host paths and local paths."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from installer.config import Config
from installer.hostroot import HostRoot

LD_DROP_IN = PurePosixPath("/etc/ld.so.conf.d/nvidia-driver-installer.conf")
NOUVEAU_BLACKLIST = PurePosixPath("/etc/modprobe.d/blacklist-nouveau.conf")
READY_FILE = PurePosixPath("/run/nvidia-driver-installer/driver-ready")
# "The GPUs are usable": the driver verified and loaded and every component container up for it
# (on a board with an NVLink fabric, Fabric Manager and NVLSM registered the GPUs): exactly when
# the scheduling gate would open. What a GPU consumer (device plugin, workload) waits for;
# driver-ready alone is written while a fabric is still coming up.
GPUS_READY_FILE = READY_FILE.parent / "gpus-ready"
MODULES_SUBDIR = "updates/nvidia-driver-installer"


class Layout(NamedTuple):
    """The install dir's layout (GKE-compatible `bin/`, `lib64/`, `drivers/` at the top).

    ```
    <install>/versions/<ver>/{bin,lib64,firmware,share}   user-space of one driver version
    <install>/current -> versions/<ver>                    switched atomically
    <install>/bin -> current/bin, lib64 -> current/lib64
    <install>/drivers -> cache/modules/<ver>/<kernel>/<flavour>
    <install>/cache/{downloads,extracted,modules,tmp}
    <install>/state.json, .cache (GKE's record), .installer.lock
    ```
    """

    root: HostRoot
    install_host: PurePosixPath
    install_local: Path
    cache_host: PurePosixPath
    dev_dir: Path = Path("/dev")

    @classmethod
    def from_config(cls, config: Config, root: HostRoot) -> Layout:
        install_local = _local_install_dir(config, root)
        cache_host = config.cache_dir or config.install_dir_host / "cache"
        return cls(root, config.install_dir_host, install_local, cache_host)

    def local(self, host_path: PurePosixPath) -> Path:
        """Local path of a host path, using the install dir mount when it is below it."""
        try:
            rel = host_path.relative_to(self.install_host)
        except ValueError:
            return self.root.local_resolved(host_path)
        return self.install_local.joinpath(*rel.parts)

    @property
    def cache_local(self) -> Path:
        return self.local(self.cache_host)

    def anchor_for(self, path: Path) -> Path:
        """Where a walk to `path` starts without following links (installer/safefs.py): the
        install dir for what lies below it (so a `cache` or `versions` link planted by a pod
        that mounts the install dir is refused), else the cache the operator named, else the
        path's own directory."""
        for top in (self.install_local, self.cache_local):
            try:
                path.relative_to(top)
            except ValueError:
                continue
            return top
        return path.parent

    @property
    def cache_anchor(self) -> Path:
        return self.anchor_for(self.cache_local)

    @property
    def downloads(self) -> Path:
        return self.cache_local / "downloads"

    @property
    def tmp(self) -> Path:
        return self.cache_local / "tmp"

    def extracted(self, version: str) -> Path:
        return self.cache_local / "extracted" / version

    def module_build(self, version: str, kernel: str, flavour: str) -> Path:
        return self.cache_local / "modules" / version / kernel / flavour

    def version_dir(self, version: str) -> Path:
        return self.install_local / "versions" / version

    @property
    def state_file(self) -> Path:
        return self.install_local / "state.json"

    @property
    def gke_cache_file(self) -> Path:
        return self.install_local / ".cache"

    @property
    def lock_file(self) -> Path:
        return self.install_local / ".installer.lock"

    @property
    def installer_log(self) -> Path:
        return self.install_local / "nvidia-installer.log"

    @property
    def bin_dir(self) -> Path:
        return self.install_local / "bin"

    @property
    def lib_dir(self) -> Path:
        return self.install_local / "lib64"

    @property
    def lib_dir_host(self) -> PurePosixPath:
        return self.install_host / "lib64"

    def host_modules_dir(self, kernel: str) -> PurePosixPath:
        return PurePosixPath("/lib/modules") / kernel / MODULES_SUBDIR

    def host_firmware_dir(self, version: str) -> PurePosixPath:
        return PurePosixPath("/lib/firmware/nvidia") / version


def _local_install_dir(config: Config, root: HostRoot) -> Path:
    """The install dir as this process reaches it.

    In the DaemonSet the host dir is mounted at NVIDIA_INSTALL_DIR_CONTAINER; through the host
    root it may be hidden when it sits on another mount. Use the container mount when it is
    there and is the same directory (or the root path does not exist), else the root path.
    """
    # Host symlinks resolve inside the root (/var/lib/nvidia -> /srv/nvidia is the host's /srv).
    via_root = root.local_resolved(config.install_dir_host)
    if root.is_bare:
        return via_root
    container = config.install_dir_container
    if container.is_dir():
        if not via_root.exists():
            return container
        try:
            if os.path.samefile(container, via_root):
                return container
        except OSError:
            pass
    return via_root
