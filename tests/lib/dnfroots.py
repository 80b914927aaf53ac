"""Rocky host roots for the dnf source's tests with the real dnf and rpm: an initialised rpm
database holding only the kit's kit-base (a shell for scriptlets), /etc/yum.repos.d with the
stand-in EPEL, and the GPUs a test asks for."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path

from kit.rpm import KERNEL, KERNEL8, install_base, write_repo_file

from lib.hostkit import GCC_LINE, RUNNING_KERNEL
from lib.hosttrees import make_host


def make_root(path: Path, extras: Path, major: int = 9, epel: bool = True,
              gpus: Iterable[int] = (0x2330,)) -> Path:
    """Rocky 9.4 (or 8.9) with an H100 (or `gpus`), an rpm database holding only kit-base,
    /etc/yum.repos.d with EPEL enabled (or not)."""
    root = path / "host"
    make_host(root, distro=f"rocky-{major}", kernel=RUNNING_KERNEL, gpus=tuple(gpus))
    with (root / "etc/os-release").open("a") as handle:
        handle.write(f'PLATFORM_ID="platform:el{major}"\n')
    subprocess.run(["rpm", "--root", str(root), "--initdb"], check=True)
    for directory in (
        "etc/yum.repos.d",
        "etc/ld.so.conf.d",
        "etc/modprobe.d",
        f"lib/modules/{KERNEL if major == 9 else KERNEL8}",
    ):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "proc/version").write_text(GCC_LINE.format(k=RUNNING_KERNEL))
    (root / "dev").mkdir(exist_ok=True)
    os.mknod(root / "dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what devtmpfs gives
    install_base(root, extras)
    if epel:
        write_repo_file(root / "etc/yum.repos.d/epel.repo", f"file://{extras / 'epel'}", "epel",
                        signed=False)
    return root


def host_has_files_of(root: Path, *repo_files: Path) -> None:
    """The key and certificate files `repo_files` name (gpgkey=file://..., sslcacert=...) also
    at the same path inside `root`. Those are paths of the host, which the installer reaches
    inside the root (as dnf --installroot would not on its own); the test's repo files name
    the kit's key and the test CA where they lie on this machine, so a host that uses such a
    repo file has them there too."""
    import re
    import shutil

    for repo_file in repo_files:
        text = repo_file.read_text()
        named = [m.group(1) for m in re.finditer(r"^gpgkey\s*=\s*file://(\S+)", text, re.M)]
        named += [m.group(1) for m in
                  re.finditer(r"^ssl(?:cacert|clientcert|clientkey)\s*=\s*(/\S+)", text, re.M)]
        for path in named:
            inside = root / path.lstrip("/")
            inside.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, inside)
