"""Temporary host roots with real Debian kernel headers at a relocated path, and a way to run
the real installer against them (used by integration, deploy and bench)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from lib.hosttrees import make_host

REPO = Path(__file__).resolve().parents[2]
RUNNING_KERNEL = "6.18.0-test-running"
INSTALL_DIR_HOST = "/home/kubernetes/bin/nvidia"
GCC_LINE = (
    "Linux version {k} (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14+deb12u1) "
    "12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian\n"
)


@functools.lru_cache(maxsize=1)
def debian_headers() -> tuple[str, tuple[str, ...]] | None:
    """(kernel release, header trees) of the Debian headers installed on this machine."""
    src = Path("/usr/src")
    for arch_dir in sorted(src.glob("linux-headers-*-amd64")):
        kernel = arch_dir.name.removeprefix("linux-headers-")
        common = src / f"linux-headers-{kernel.removesuffix('-amd64')}-common"
        kbuild = sorted(Path("/usr/lib").glob("linux-kbuild-*"))
        if common.is_dir() and kbuild:
            trees = (str(arch_dir), str(common), str(kbuild[-1]))
            return kernel, trees
    return None


def make_debian_host(
    root: Path,
    *,
    gpus: Iterable[int] = (0x2330,),
    headers: bool = True,
    modules: Iterable[str] = (),
    secure_boot: bool | None = False,
    extra_kernels: Iterable[str] = (),
) -> str:
    """A Debian 12 host root whose running kernel differs from the headers' kernel (so nothing
    is ever loaded into this machine's kernel); returns the headers' kernel release."""
    found = debian_headers()
    assert found is not None, "linux-headers-amd64 is not installed"
    kernel, trees = found
    make_host(
        root,
        distro="debian-12",
        kernel=RUNNING_KERNEL,
        gpus=gpus,
        modules=modules,
        secure_boot=secure_boot,
    )
    if headers:
        for tree in trees:
            dest = root / tree.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if subprocess.run(["cp", "-al", tree, str(dest)], check=False).returncode != 0:
                shutil.copytree(tree, dest, symlinks=True, dirs_exist_ok=True)
    for name in (kernel, *extra_kernels):
        modules_dir = root / "lib/modules" / name
        modules_dir.mkdir(parents=True, exist_ok=True)
        # Debian's linux-headers-<k> ships both links: build is the output tree, source the
        # -common tree (nvidia-installer's default source path).
        os.symlink(f"/usr/src/linux-headers-{name}", modules_dir / "build")
        if headers:
            os.symlink(trees[1], modules_dir / "source")
    for name in extra_kernels:
        _clone_headers(root, kernel, name)
    (root / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/modprobe.d").mkdir(parents=True, exist_ok=True)
    (root / "proc/version").write_text(GCC_LINE.format(k=RUNNING_KERNEL))
    return kernel


def _clone_headers(root: Path, kernel: str, other: str) -> None:
    """Headers for another kernel release: the arch tree copied, its UTS_RELEASE changed."""
    src = root / f"usr/src/linux-headers-{kernel}"
    dest = root / f"usr/src/linux-headers-{other}"
    shutil.copytree(src, dest, symlinks=True)
    uts = dest / "include/generated/utsrelease.h"
    uts.unlink()
    uts.write_text(f'#define UTS_RELEASE "{other}"\n')


def installer_env(root: Path, kernel: str, **settings: str) -> dict[str, str]:
    """GKE's DaemonSet environment pointed at `root`, building for `kernel`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_", "ROOT_MOUNT"))}
    env.update(
        {
            "ROOT_MOUNT_DIR": str(root),
            "NVIDIA_INSTALL_DIR_HOST": INSTALL_DIR_HOST,
            "NVIDIA_INSTALL_DIR_CONTAINER": str(root.parent / "container-mount-absent"),
            "NVIDIA_KERNEL_RELEASE": kernel,
            "NVIDIA_INSTALLER_FETCH_HEADERS": "false",
            "NVIDIA_INSTALLER_RETRIES": "2",
            "PYTHONPATH": str(REPO),
        }
    )
    env.update(settings)
    return env


def private_mounts_argv(mounts: list[str], argv: list[str]) -> list[str]:
    """Run argv in a private mount namespace after the given mount commands."""
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            f'{" && ".join(mounts)} && exec "$@"', "sh", *argv]


def hidden_headers_argv(argv: list[str]) -> list[str]:
    """Run argv where this machine's own header trees are hidden (tmpfs over them), so only
    the host root's relocated copies can make a build work."""
    found = debian_headers()
    trees = ["/usr/src"] + ([found[1][2]] if found else [])
    mounts = [f"mount -t tmpfs none {t}" for t in trees]
    # The installer's own /lib/firmware (a container's, not the host root's): whatever lands
    # there is lost, as in a DaemonSet, and never reaches this machine.
    mounts.append("{ [ ! -d /lib/firmware ] || mount -t tmpfs none /lib/firmware; }")
    return private_mounts_argv(mounts, argv)


def installer_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "installer", *args]


def run_installer(
    env: Mapping[str, str],
    *args: str,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hidden_headers_argv(installer_argv(*args)),
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """`result` of a run that must have succeeded; otherwise the test fails showing the tail
    of its stderr."""
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def run_and_kill_at(env: Mapping[str, str], marker: str, timeout: float = 300) -> str:
    """Start `installer run`, SIGKILL its whole process group (as a container's death would)
    when `marker` appears in its log; return the log up to then."""
    proc = subprocess.Popen(
        hidden_headers_argv(installer_argv("run")),
        env=dict(env),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    seen = []
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            seen.append(line)
            if marker in line:
                os.killpg(proc.pid, signal.SIGKILL)
                break
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)
    return "".join(seen)


def tree_snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """path -> (mode, mtime_ns, link target) for everything under root, to prove no change."""
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            target = os.readlink(path) if path.is_symlink() else ""
            snap[str(path.relative_to(root))] = (info.st_mode, info.st_mtime_ns, target)
    return snap
