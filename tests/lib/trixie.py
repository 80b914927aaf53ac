"""Debian 13 in tests: trixie host roots from Debian's real archive (6.12 split headers, the
deb822 debian.sources a trixie system carries) and the installer run inside a trixie image root
(mmdebstrap'd minbase with trixie's own gcc-14, python3 and apt), chrooted in a private mount
namespace where only the test's temp dirs and this checkout are bind-mounted in.

The parts come from the cache `scripts/install-deps` fills (kit.trixie_parts); a missing cache
fails the test with a pointer to install-deps (never a skip).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from kit import trixie_parts
from kit.real_parts import RealParts

from lib.headerrepos import Key, publish_apt
from lib.hostkit import INSTALL_DIR_HOST, REPO, RUNNING_KERNEL, installer_env
from lib.hosttrees import make_host
from lib.realdriver import required

VERSION = trixie_parts.VERSION
BUILD_TIMEOUT = 3000  # two real compiles side by side: 5-15 min on 2 shared cores
# As trixie's own kernels write it (Debian 6.12.x-1 was built with trixie's gcc-14).
GCC14_LINE = (
    "Linux version {k} (debian-kernel@lists.debian.org) (x86_64-linux-gnu-gcc-14 (Debian "
    "14.2.0-19) 14.2.0, GNU ld (GNU Binutils for Debian) 2.44) #1 SMP PREEMPT_DYNAMIC Debian\n"
)
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def parts() -> RealParts:
    return required(trixie_parts.require_parts)


def headers() -> trixie_parts.TrixieHeaders:
    return required(trixie_parts.require_headers)


def image_root(dest: Path) -> Path:
    """The trixie image root unpacked at `dest`, with nvidia-ml-py (pure Python, the
    installer's one dependency Debian has only as a package that pulls the driver's own
    libraries in) copied from this machine's site-packages."""
    tarball = required(trixie_parts.require_image)
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-xf", str(tarball), "-C", str(dest)], check=True)
    import pynvml

    site = dest / "usr/lib/python3/dist-packages"
    shutil.copy2(pynvml.__file__, site / "pynvml.py")
    return dest


def in_image_argv(image: Path, binds: tuple[Path, ...], argv: list[str]) -> list[str]:
    """argv run chrooted in `image`, in a private mount namespace with /dev, /proc and `binds`
    (at their own paths) mounted in; nothing changes outside the namespace."""
    # The image root is a mount point, as a container's root is: the installer's own
    # `unshare --mount --propagation private` changes the propagation of "/".
    mounts = [f"mount --bind {shlex.quote(str(image))} {shlex.quote(str(image))}",
              f"mount --rbind /dev {shlex.quote(str(image / 'dev'))}",
              f"mount -t proc proc {shlex.quote(str(image / 'proc'))}"]
    for path in binds:
        inside = shlex.quote(str(image) + str(path))
        mounts.append(f"mkdir -p {inside} && mount --bind {shlex.quote(str(path))} {inside}")
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            f'{" && ".join(mounts)} && exec chroot "$0" "$@"', str(image), *argv]


def run_in_image(image: Path, binds: tuple[Path, ...], env: dict[str, str], *args: str,
                 timeout: float = BUILD_TIMEOUT) -> subprocess.Popen[str]:
    """`python3 -m installer <args>` with trixie's python3, at nice 10 (the machine is
    shared); returns the running process (two builds run side by side)."""
    argv = ["nice", "-n", "10", "python3", "-m", "installer", *args]
    return subprocess.Popen(in_image_argv(image, (REPO, *binds), argv), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def image_env(root: Path, kernel: str, run: Path, flavour: str, **settings: str
              ) -> dict[str, str]:
    env = installer_env(root, kernel, NVIDIA_DRIVER_VERSION=VERSION,
                        NVIDIA_KERNEL_MODULE_TYPE=flavour,
                        NVIDIA_DRIVER_DOWNLOAD_URL=f"file://{run}", **settings)
    env.update(PATH=IMAGE_PATH, PYTHONDONTWRITEBYTECODE="1", HOME="/root", LC_ALL="C.UTF-8")
    return env


def make_trixie_host(root: Path, trees: trixie_parts.TrixieHeaders, *, installed: bool,
                     archive: str, key: Key, gpus: tuple[int, ...] = (0x2330,)) -> str:
    """A Debian 13 host root: trixie's os-release, /proc/version naming gcc-14, the deb822
    debian.sources a trixie system has (two stanzas, snapshot comments, Signed-By the archive
    keyring) pointing at `archive`, and, when `installed`, the split headers as the packages
    lay them out (with /lib/modules/<k>/{build,source}). The running kernel differs, so
    nothing is loaded. Returns the headers' kernel release."""
    # Trixie is merged-/usr: /lib, /bin, ... are links into /usr, so the packages' own
    # /usr/lib/modules/<k>/{build,source} links are the host's /lib/modules ones.
    for top in ("bin", "sbin", "lib", "lib64"):
        (root / "usr" / top).mkdir(parents=True, exist_ok=True)
        (root / top).symlink_to(f"usr/{top}")
    make_host(root, distro="debian-13", kernel=RUNNING_KERNEL, gpus=gpus)
    if installed:
        for sub in ("usr/src", "usr/lib"):
            dest = root / sub
            dest.mkdir(parents=True, exist_ok=True)
            for entry in (trees.root / sub).iterdir():
                if subprocess.run(["cp", "-al", str(entry), str(dest / entry.name)],
                                  check=False).returncode != 0:
                    shutil.copytree(entry, dest / entry.name, symlinks=True)
    else:
        (root / "lib/modules" / trees.kernel).mkdir(parents=True)
    keyring = root / KEYRING.lstrip("/")
    keyring.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(key.keyring, keyring)
    parts = root / "etc/apt/sources.list.d"
    parts.mkdir(parents=True, exist_ok=True)
    (parts / "debian.sources").write_text(
        f"Types: deb\n# http://snapshot.debian.org/archive/debian/20251115T000000Z\n"
        f"URIs: {archive}/debian\nSuites: trixie trixie-updates\n"
        "Components: main contrib non-free non-free-firmware\n"
        f"Signed-By: {KEYRING}\n\n"
        "Types: deb\n# http://snapshot.debian.org/archive/debian-security/20251115T000000Z\n"
        f"URIs: {archive}/debian-security\nSuites: trixie-security\n"
        "Components: main contrib non-free non-free-firmware\n"
        f"Signed-By: {KEYRING}\n")
    (root / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/modprobe.d").mkdir(parents=True, exist_ok=True)
    (root / "proc/version").write_text(GCC14_LINE.format(k=RUNNING_KERNEL))
    return trees.kernel


def publish_trixie(www: Path, trees: trixie_parts.TrixieHeaders, key: Key) -> None:
    """Trixie's real header .debs in a signed archive shaped like Debian's: the current ABI's
    headers sit in trixie-security (where Debian's archive has them), the main suite and
    -updates hold them too (publish_apt indexes the whole pool)."""
    debs = list(trees.debs)
    for suite in ("trixie", "trixie-updates"):
        publish_apt(www / "debian", suite, debs, key)
    publish_apt(www / "debian-security", "trixie-security", debs, key)


def install_dir(root: Path) -> Path:
    return root / INSTALL_DIR_HOST.lstrip("/")
