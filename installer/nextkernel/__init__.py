"""The next kernel before the reboot: find a newer kernel installed on the host and get the
installed driver's modules for it into the cache, so booting it is the warm path.

A kernel is pending when `/lib/modules/<K>/modules.dep` and `/boot/vmlinuz-<K>` both exist
(what a kernel package's install leaves; a removed kernel's leftover module dir has no
modules.dep) and it is newer than the kernel this run installs for, of the same flavour
(`-amd64` stays `-amd64`, `-aws` stays `-aws`, `+debug` stays `+debug`). Only the newest counts.
Getting its modules is what `installer prebuild --kernel K` does (a registry artifact when one
matches, else a compile against its headers, fetched when missing), run after the current
driver is verified; a failure there only warns and is recorded in `<cache>/next-kernel.json`.
"""

from __future__ import annotations

from installer.nextkernel.detect import (
           ReleaseKey,
           is_installed,
           is_newer,
           pending_kernel,
           release_key,
)
from installer.nextkernel.planning import STEP_NAME, decision, extend, split_steps, steps
from installer.nextkernel.service import prepare_installed, status, watch

__all__ = ["STEP_NAME", "ReleaseKey", "decision", "extend", "is_installed", "is_newer",
           "pending_kernel", "prepare_installed", "release_key", "split_steps", "status",
           "steps", "watch"]
