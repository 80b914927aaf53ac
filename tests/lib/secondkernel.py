"""A second Debian 6.1 kernel ABI beside this machine's: Debian's own image, header and kbuild
packages of 6.1.0-47-amd64 (scripts/install-deps keeps them in the shared deb cache), unpacked
once into a root-shaped directory outside the clone, as installing them on a host would leave
them (depmod run, as the image's postinst does; of its modules only those a guest boots
with). Nothing is installed on this machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from lib.bootmodules import BOOT_MODULES

SECOND = "6.1.0-47-amd64"
_ABI = SECOND.removesuffix("-amd64")
DEBS = Path(os.environ.get("INSTALLER_TEST_DEBS", "/var/cache/installer-test/debs"))
CACHE = Path(os.environ.get("INSTALLER_TEST_CACHE", "/var/cache/installer-test"))
PACKAGES = (f"linux-image-{SECOND}", f"linux-headers-{SECOND}", f"linux-headers-{_ABI}-common",
            "linux-kbuild-6.1")
COMPLETE = ".complete"


def debs() -> list[Path]:
    """The packages' files; fails (skips outside CI) pointing at scripts/install-deps."""
    found = []
    for package in PACKAGES:
        matches = sorted(DEBS.glob(f"{package}_*.deb"))
        if not matches:
            message = f"{DEBS}/{package}_*.deb is missing: run scripts/install-deps"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        found.append(matches[-1])
    return found


def unpacked() -> Path:
    """The root-shaped directory holding the second kernel (boot/, lib/modules/<k>/ with its
    boot modules, modules.dep and the build link, usr/src headers, usr/lib/linux-kbuild-6.1);
    made once."""
    packages = debs()
    final = CACHE / f"kernel-{SECOND}"
    stamp = "".join(f"{deb.name}\n" for deb in packages) + "boot modules only\n"
    if (final / COMPLETE).is_file() and (final / COMPLETE).read_text() == stamp:
        return final / "root"
    final.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".root.", dir=final))
    try:
        for deb in packages:
            subprocess.run(["dpkg-deb", "--extract", str(deb), str(work)], check=True)
        _keep_boot_modules_only(work)
        # The image package's postinst runs depmod; without modules.dep the kernel is not
        # installed (and modprobe -d cannot list its boot modules).
        subprocess.run(["depmod", "-b", str(work), SECOND], check=True)
        os.chmod(work, 0o755)
        shutil.rmtree(final / "root", ignore_errors=True)
        os.rename(work, final / "root")
        (final / COMPLETE).write_text(stamp)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final / "root"


def _keep_boot_modules_only(root: Path) -> None:
    """Of the image's ~4000 modules keep the ones a guest boots with (lib/bootmodules.py):
    a guest's depmod reads every module of its kernel through 9p, minutes under TCG."""
    modules = root / "lib/modules" / SECOND
    subprocess.run(["depmod", "-b", str(root), SECOND], check=True)
    shown = subprocess.run(["modprobe", "-d", str(root), "-S", SECOND, "--show-depends", "-a",
                            *BOOT_MODULES], check=True, capture_output=True, text=True).stdout
    keep = {Path(line.split()[1]) for line in shown.splitlines() if line.startswith("insmod ")}
    assert keep, shown
    for path in sorted((modules / "kernel").rglob("*.ko")):
        if path not in keep:
            path.unlink()


HEADER_TREES = (f"usr/src/linux-headers-{SECOND}", f"usr/src/linux-headers-{_ABI}-common",
                "usr/lib/linux-kbuild-6.1")


def add_headers(root: Path) -> None:
    """The second kernel's headers (as its header packages install them) into a host root."""
    source = unpacked()
    for tree in HEADER_TREES:
        dest = root / tree
        dest.parent.mkdir(parents=True, exist_ok=True)
        if subprocess.run(["cp", "-al", str(source / tree), str(dest)],
                          check=False).returncode != 0:
            shutil.copytree(source / tree, dest, symlinks=True, dirs_exist_ok=True)
    build = root / "lib/modules" / SECOND / "build"
    build.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.readlink(source / "lib/modules" / SECOND / "build"), build)


def mark_installed(root: Path, release: str) -> None:
    """What a kernel image package leaves for the installer to see: modules.dep and vmlinuz
    (stand-ins: nothing boots from an integration host root)."""
    modules = root / "lib/modules" / release
    modules.mkdir(parents=True, exist_ok=True)
    (modules / "modules.dep").write_text("")
    (root / "boot").mkdir(exist_ok=True)
    (root / "boot" / f"vmlinuz-{release}").write_bytes(b"stand-in kernel image\n")
