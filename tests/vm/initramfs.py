"""Builds (once per kernel and init script) the busybox initramfs that boots the guest."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from lib.bootmodules import BOOT_MODULES

from vm.guest_kernel import GuestKernel

GUEST_DIR = Path(__file__).parent / "guest"
BUSYBOX = Path("/bin/busybox")


def cache_dir() -> Path:
    return Path(os.environ.get("INSTALLER_VM_CACHE", Path(tempfile.gettempdir()) / "installer-vm"))


def module_files(kernel: GuestKernel, modules: tuple[str, ...]) -> list[Path]:
    """The .ko files for `modules` with their dependencies, in load order."""
    result = subprocess.run(
        ["modprobe", "-d", str(kernel.base), "-S", kernel.release, "--show-depends", "-a",
         *modules],
        check=True,
        capture_output=True,
        text=True,
    )
    files: list[Path] = []
    for line in result.stdout.splitlines():
        words = line.split()
        # modprobe -d / prints //lib/modules/...: one leading slash, so paths compare.
        module = Path("/" + words[1].lstrip("/")) if words[:1] == ["insmod"] else None
        if module is not None and module not in files:
            files.append(module)
    return files


def boot_module_files(kernel: GuestKernel) -> list[Path]:
    """The .ko files for BOOT_MODULES with their dependencies, in load order."""
    return module_files(kernel, BOOT_MODULES)


def build_initramfs(kernel: GuestKernel) -> Path:
    """Returns the cached initramfs for this kernel, building it if needed."""
    init_script = (GUEST_DIR / "init").read_bytes()
    recipe = init_script + BUSYBOX.read_bytes() + " ".join(BOOT_MODULES).encode()
    digest = hashlib.sha256(recipe).hexdigest()[:12]
    where = "" if kernel.base == Path("/") else "-unpacked"
    target = cache_dir() / f"initramfs-{kernel.release}{where}-{digest}.cpio.gz"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        root = Path(work) / "root"
        _populate(root, kernel, init_script)
        archive = Path(work) / "initramfs.cpio.gz"
        _write_cpio(root, archive)
        os.replace(archive, target)
    return target


def _populate(root: Path, kernel: GuestKernel, init_script: bytes) -> None:
    for name in ("bin", "dev", "proc", "sys", "modules"):
        (root / name).mkdir(parents=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    (root / "init").write_bytes(init_script)
    (root / "init").chmod(0o755)
    order = []
    for module in boot_module_files(kernel):
        if module.suffix != ".ko":
            raise RuntimeError(f"busybox insmod cannot load compressed module {module}")
        shutil.copy2(module, root / "modules" / module.name)
        order.append(module.name)
    (root / "modules" / "order").write_text("\n".join(order) + "\n")


def _write_cpio(root: Path, archive: Path) -> None:
    names = sorted(str(path.relative_to(root)) for path in root.rglob("*"))
    cpio = subprocess.run(
        ["cpio", "--quiet", "-o", "-H", "newc", "--owner=0:0"],
        cwd=root,
        input=("\n".join(names) + "\n").encode(),
        check=True,
        capture_output=True,
        text=False,
    )
    archive.write_bytes(gzip.compress(cpio.stdout, compresslevel=1))
