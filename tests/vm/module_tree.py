"""The guest's /lib/modules/<k>: only the modules its boots use, with depmod's files for them.

This machine's tree holds ~4000 modules (~400 MB). Every depmod the installer runs in the guest
reads all of them through 9p under TCG: 40-60 s each, several times per scenario. A node with
fewer modules is still a real node: the guest gets this smaller tree (stage2.sh copies it once
onto the state disk and bind-mounts it over /lib/modules/<k>), and the installer's depmod,
modprobe and module installs work on it as on any host.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from lib.bootmodules import BOOT_MODULES

from vm.guest_kernel import GuestKernel
from vm.initramfs import cache_dir, module_files

# What scenarios load from the host's tree: the boot modules again (modprobe is a no-op for them),
# drm for NVIDIA's real nvidia.ko (tests/vm/test_real_driver_vm.py) and its helpers.
KEPT_MODULES = (*BOOT_MODULES, "drm", "drm_kms_helper", "loop")
# depmod's inputs besides the modules; the rest (modules.dep, .alias, .symbols ...) it writes.
DEPMOD_INPUTS = ("modules.builtin", "modules.builtin.modinfo")


def kept_module_files(kernel: GuestKernel) -> list[Path]:
    """The .ko files of KEPT_MODULES and their dependencies."""
    return module_files(kernel, KEPT_MODULES)


def module_tree(kernel: GuestKernel) -> Path | None:
    """The cached small tree for `kernel` (its lib/modules/<release>), built if needed; None
    for a kernel unpacked elsewhere, whose tree the scenario sets up itself."""
    if kernel.base != Path("/"):
        return None
    stamp = (kernel.modules_dir / "modules.dep").stat().st_mtime_ns
    recipe = f"{kernel.release} {stamp} {' '.join(KEPT_MODULES)}".encode()
    digest = hashlib.sha256(recipe + Path(__file__).read_bytes()).hexdigest()[:12]
    target = cache_dir() / f"modules-{kernel.release}-{digest}"
    tree = target / "lib/modules" / kernel.release
    if tree.is_dir():
        return tree
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        _populate(Path(work) / "root", kernel)
        try:
            os.rename(Path(work) / "root", target)
        except OSError:  # another session made it first
            if not tree.is_dir():
                raise
    return tree


def _populate(root: Path, kernel: GuestKernel) -> None:
    tree = root / "lib/modules" / kernel.release
    tree.mkdir(parents=True)
    kept = []
    for module in kept_module_files(kernel):
        relative = module.relative_to(kernel.modules_dir)
        (tree / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(module, tree / relative)
        kept.append(str(relative))
    order = (kernel.modules_dir / "modules.order").read_text().split()
    (tree / "modules.order").write_text("".join(f"{m}\n" for m in order if m in kept))
    for name in DEPMOD_INPUTS:
        shutil.copy2(kernel.modules_dir / name, tree / name)
    for link in ("build", "source"):
        if (kernel.modules_dir / link).is_symlink():
            (tree / link).symlink_to(os.readlink(kernel.modules_dir / link))
    subprocess.run(["depmod", "-b", str(root), kernel.release], check=True, capture_output=True)
