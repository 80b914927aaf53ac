"""An arm64 Debian 12 root for the arm64 guest: Debian's own arm64 packages (python3 and the
installer's dependencies, kmod, libc-bin's real ldconfig, busybox) unpacked by
`mmdebstrap --variant=extract` (no emulation needed) into a tarball under
/var/cache/installer-test keyed by its inputs (`scripts/install-deps` runs
`python3 -m vm.arm64_root` from tests/: tests never reach the network), then, per boot, made
into an ext4 disk image (`mke2fs -d`) with this checkout's installer, a small module tree of
the guest kernel and the scenario.

Nothing in the root runs on this machine: the guest's own kernel and qemu-system-aarch64 run it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from kit import real_parts
from kit.cache import mmdebstrap_tarball

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
# The installer's dependencies as Debian ships them for arm64 (cryptography is compiled, so the
# wheels of this machine would not do); nvidia-ml-py is not in Debian: its one pure-Python file
# comes from this machine's installation. base-files gives /etc/os-release, base-passwd the
# users and groups (written below, as its maintainer script would), libc-bin the real ldconfig,
# docker-registry the node's own view of the builder's registry (see test_arm64_node_vm.py).
PACKAGES = (
    "base-files", "base-passwd", "bash", "dash", "coreutils", "busybox", "gzip", "tar", "grep",
    "sed", "findutils", "util-linux", "mount", "kmod", "libc-bin",
    "python3", "python3-requests", "python3-click", "python3-tenacity", "python3-cryptography",
    "python3-yaml", "docker-registry",
)
MMDEBSTRAP_ARGS = ["--variant=extract", "--mode=root", "--format=tar", "--architectures=arm64",
                   f"--include={','.join(PACKAGES)}", SUITE]
DISK_BYTES = 3 << 30  # sparse: the root, a real .run (142 MB) and its extraction
GUEST_PYTHON = (3, 11)  # bookworm's python3


def archive() -> str:
    return os.environ.get(real_parts.ARCHIVE_ENV) or "http://deb.debian.org/debian"


def tarball_key() -> str:
    """The tarball's inputs: the mmdebstrap call and the archive."""
    inputs = json.dumps([MMDEBSTRAP_ARGS, archive()])
    return hashlib.sha256(inputs.encode()).hexdigest()[:16]


def tarball_path(cache: Path | None = None) -> Path:
    return (cache or real_parts.cache_root()) / f"arm64-root-{tarball_key()}.tar"


def require(cache: Path | None = None) -> Path:
    """The cached tarball; raises PartsMissing (pointing at install-deps) when it is not there."""
    found = tarball_path(cache)
    if not found.is_file():
        raise real_parts.PartsMissing(
            f"the arm64 root tarball {found} is missing: run scripts/install-deps (it runs "
            "`python3 -m vm.arm64_root` from tests/)")
    return found


def fetch(cache: Path | None = None) -> tuple[Path, float]:
    """The arm64 root tarball (made once per key on this machine) and the seconds it took."""
    target = tarball_path(cache)
    if target.is_file():
        return target, 0.0
    if shutil.which("mmdebstrap") is None:
        raise FileNotFoundError("mmdebstrap is not installed (scripts/install-deps)")
    seconds = mmdebstrap_tarball(target, [*MMDEBSTRAP_ARGS, archive()], stale="arm64-root-*.tar",
                                 timeout=900)
    return target, seconds


def unpack(tarball: Path, root: Path) -> Path:
    """The tarball unpacked at `root`, with what the packages' maintainer scripts would add."""
    root.mkdir(parents=True)
    subprocess.run(["tar", "-xf", str(tarball), "-C", str(root), "--numeric-owner"], check=True)
    for name in ("passwd", "group"):
        shutil.copy2(root / f"usr/share/base-passwd/{name}.master", root / "etc" / name)
    (root / "etc/hostname").write_text("arm64-node\n")
    for directory in ("proc", "sys", "dev", "run", "tmp", "root", "var/tmp"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    return root


def add_installer(root: Path, target: str = "opt/installer") -> str:
    """This checkout's installer package and nvidia-ml-py's pynvml.py under /<target> (the
    guest's PYTHONPATH, which it returns)."""
    import pynvml

    dest = root / target
    dest.mkdir(parents=True)
    shutil.copytree(REPO / "installer", dest / "installer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(pynvml.__file__, dest / "pynvml.py")
    return f"/{target}"


def add_module_tree(root: Path, source: Path, release: str, names: list[str]) -> None:
    """The guest kernel's /lib/modules/<release> with only the .ko files in `names` (paths
    relative to `source`), and depmod's files for them (this machine's depmod reads any
    architecture's modules)."""
    tree = root / "lib/modules" / release
    tree.mkdir(parents=True)
    for name in names:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, tree / name)
    order = (source / "modules.order").read_text().split()
    (tree / "modules.order").write_text("".join(f"{m}\n" for m in order if m in names))
    for name in ("modules.builtin", "modules.builtin.modinfo"):
        shutil.copy2(source / name, tree / name)
    subprocess.run(["depmod", "-b", str(root), release], check=True, capture_output=True)


def precompile(root: Path) -> None:
    """Byte-compile the root's Python (stdlib, Debian's packages, the installer) here when this
    machine's Python is the guest's version (.pyc files are the same on every architecture):
    under TCG each interpreter start would otherwise compile what it imports (18 s for the
    installer's imports, measured), and nothing in the extracted root has compiled them."""
    import sys

    if sys.version_info[:2] != GUEST_PYTHON:
        return
    major, minor = GUEST_PYTHON
    trees = [root / f"usr/lib/python{major}.{minor}", root / "usr/lib/python3/dist-packages",
             root / "opt"]
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j0", "-s", str(root), "-p", "/",
                    *(str(t) for t in trees if t.is_dir())], check=False, capture_output=True)


def make_disk(root: Path, image: Path) -> Path:
    """An ext4 image of `root` (sparse, DISK_BYTES), made without mounting anything."""
    with open(image, "wb") as handle:
        handle.truncate(DISK_BYTES)
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-L", "arm64root", "-d", str(root),
                    str(image)], check=True, capture_output=True)
    return image


if __name__ == "__main__":
    made, seconds = fetch()
    print(f"{made} ({seconds:.0f} s)")
