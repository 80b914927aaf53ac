"""What a test host root needs besides NVIDIA's repo: a base package that gives rpm's scriptlets
a shell (a Rocky host has bash and coreutils; the root gets static busybox and xz), and a
stand-in EPEL repo holding `dkms` (the kit's dkms.sh, see its header)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import cache
from .builder import RPM_DIR, _files, _rpmbuild, spec_head

BUSYBOX = Path("/bin/busybox")
XZ = Path("/usr/bin/xz")
# busybox applets the scriptlets and dkms.sh use, as /usr/bin links.
APPLETS = (
    "basename", "cat", "chmod", "cp", "cut", "date", "depmod", "dirname", "echo", "find", "grep",
    "head", "id", "ln", "ls", "mkdir", "mv", "readlink", "rm", "rmdir", "sed", "sort", "tail",
    "touch", "tr", "true", "false", "uname", "xargs",
)
DKMS_VERSION = "3.0.13"


def build_extras() -> Path:
    """`base/kit-base.rpm` (install it into a test root before anything else) and `epel/`
    (a repo with `dkms`), cached like build_repo's output."""
    inputs = [RPM_DIR / "extras.py", RPM_DIR / "dkms.sh", RPM_DIR / "builder.py"]
    key = f"rpmextras-{cache.tree_digest(inputs)[:12]}"
    return cache.cached_dir(key, _build)


def base_rpm(extras: Path) -> Path:
    return next((extras / "base").glob("kit-base-*.rpm"))


def install_base(root: Path, extras: Path) -> None:
    """What a minimal Rocky host has before NVIDIA's packages: a shell for scriptlets."""
    subprocess.run(
        ["rpm", "--root", str(root), "-i", "--nodeps", str(base_rpm(extras))],
        check=True,
        capture_output=True,
    )


def _build(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="kit-rpm-extras.") as scratch:
        work = Path(scratch)
        stage = work / "stage"
        _stage_base(stage / "kit-base")
        (out / "base").mkdir()
        _rpmbuild("kit-base", _base_spec(stage), stage, work, out / "base")
        dkms = stage / "dkms"
        (dkms / "usr/sbin").mkdir(parents=True)
        shutil.copy2(RPM_DIR / "dkms.sh", dkms / "usr/sbin/dkms")
        (dkms / "var/lib/dkms").mkdir(parents=True)
        (out / "epel").mkdir()
        _rpmbuild("dkms", _dkms_spec(stage), stage, work, out / "epel")
        subprocess.run(
            ["createrepo_c", "--quiet", str(out / "epel")], check=True, capture_output=True
        )


def _stage_base(base: Path) -> None:
    (base / "usr/bin").mkdir(parents=True)
    (base / "usr/sbin").mkdir(parents=True)
    (base / "bin").mkdir()
    shutil.copy2(BUSYBOX, base / "usr/sbin/busybox")
    os.symlink("../usr/sbin/busybox", base / "bin/sh")
    for applet in APPLETS:
        os.symlink("../sbin/busybox", base / "usr/bin" / applet)
    # xz and the libraries it links (busybox only decompresses), at the paths its loader uses.
    shutil.copy2(XZ, base / "usr/bin/xz")
    for lib in _libraries(XZ):
        dest = base / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), dest)


def _libraries(binary: Path) -> list[str]:
    out = subprocess.run(["ldd", str(binary)], check=True, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        for word in line.split():
            if word.startswith("/"):
                found.append(word)
                break
    return found


def _base_spec(stage: Path) -> str:
    text = spec_head("kit-base", "1", "a shell and xz for the scriptlets of a test root",
                     requires="Provides: /bin/sh\n")
    text += "\n%install\ncp -a %{_sourcedir}/kit-base/. %{buildroot}/\n"
    return text + "\n%files\n" + _files(stage / "kit-base")


def _dkms_spec(stage: Path) -> str:
    text = spec_head("dkms", DKMS_VERSION, "Dynamic Kernel Module Support (test-kit stand-in)",
                     release="1.el9", requires="Requires: /bin/sh\nBuildArch: noarch\n")
    text += "\n%install\ncp -a %{_sourcedir}/dkms/. %{buildroot}/\n"
    return text + "\n%files\n%attr(0755,root,root) /usr/sbin/dkms\n%dir /var/lib/dkms\n"
