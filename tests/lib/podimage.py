"""Builds the Debian 12 product image for real: an mmdebstrap base, then images/build.sh with
buildah (vfs storage, chroot isolation, no daemon), exported as an unpacked root filesystem."""

from __future__ import annotations

import datetime
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import tomllib
from kit.cache import mmdebstrap_tarball

from lib.podspec import Image

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# The base image, as the official debian:12 is made: minbase, Debian's archive as its source.
MMDEBSTRAP_ARGS = ["--variant=minbase", "--mode=root", "--format=tar", SUITE]
IMAGE_PYTHON = "3.11"  # Debian 12's python3: the wheels in the wheelhouse are for it
TOOLS = ("buildah", "mmdebstrap", "runc")


def cache_dir() -> Path:
    return Path(os.environ.get("INSTALLER_CI_CACHE", "/var/cache/installer-ci"))


def mmdebstrap_args(arch: str = "amd64") -> list[str]:
    """The base's mmdebstrap call; a foreign arch's maintainer scripts run under qemu-user."""
    return MMDEBSTRAP_ARGS if arch == "amd64" else [f"--architectures={arch}", *MMDEBSTRAP_ARGS]


def base_key(arch: str = "amd64") -> str:
    """The base tarball's inputs: the mmdebstrap call and the week (security updates)."""
    week = datetime.date.today().isocalendar()
    inputs = json.dumps([mmdebstrap_args(arch), DEBIAN_MIRROR, week[0], week[1]])
    return hashlib.sha256(inputs.encode()).hexdigest()[:16]


def base_name(arch: str = "amd64") -> str:
    return "debian12-base" if arch == "amd64" else f"debian12-{arch}-base"


def debian_base(arch: str = "amd64") -> tuple[Path, float]:
    """The mmdebstrap tarball (made once per key on this machine) and the seconds it took."""
    target = cache_dir() / f"{base_name(arch)}-{base_key(arch)}.tar"
    if target.is_file():
        return target, 0.0
    seconds = mmdebstrap_tarball(target, [*mmdebstrap_args(arch), DEBIAN_MIRROR],
                                 stale=f"{base_name(arch)}-*.tar", timeout=1800)
    return target, seconds


def wheelhouse(dest: Path) -> Path:
    """The wheels `pip wheel .` needs in the image (build backend and dependencies), fetched
    with this machine's pip configuration, so the build needs no index of its own."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = [*project["build-system"]["requires"], "wheel", *project["project"]["dependencies"]]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest),
         "--only-binary=:all:", "--python-version", IMAGE_PYTHON, *wanted],
        check=True, capture_output=True, timeout=600,
    )
    return dest


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """A directory listing on 127.0.0.1 (pip's --find-links reads its links)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Built:
    ref: str
    image: Image
    seconds: float
    base_seconds: float
    log: str


class Buildah:
    """buildah with its storage in one directory (vfs: no overlay needed, root only)."""

    def __init__(self, storage: Path) -> None:
        self.storage = storage
        self.argv = ["buildah", "--root", str(storage / "root"), "--runroot",
                     str(storage / "run"), "--storage-driver", "vfs"]

    def __call__(self, *args: str) -> str:
        result = subprocess.run([*self.argv, *args], check=True, capture_output=True, text=True,
                                timeout=600)
        return result.stdout.strip()

    def import_base(self, tarball: Path, ref: str) -> None:
        container = self("from", "scratch")
        self("add", container, str(tarball), "/")
        self("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "--cmd", "bash", container)
        self("commit", "--rm", container, ref)

    def unpack(self, ref: str) -> Image:
        """The image's root filesystem (a working container's, mounted) and its OCI config."""
        container = self("from", "--name", "pod-image", ref)
        rootfs = Path(self("mount", container))
        config = json.loads(self("inspect", "--type", "image", ref))["OCIv1"]["config"]
        return Image(rootfs, config)

    def remove(self) -> None:
        subprocess.run([*self.argv, "rm", "--all"], capture_output=True, check=False)
        shutil.rmtree(self.storage, ignore_errors=True)


def run_build_sh(buildah: Buildah, base: str, links: str, *, timeout: int,
                 platforms: Sequence[str] = (), layers: bool = False) -> str:
    """images/build.sh --only debian12 with buildah on the base image `base`, pip taking only the
    wheels served at `links`; its log (raises with the log's tail on failure)."""
    layer_opt = "--layers " if layers else ""
    env = {
        **os.environ,
        "BUILDER": "buildah",
        "BUILDAH": " ".join(buildah.argv),
        **({"PLATFORMS": ",".join(platforms)} if platforms else {}),
        "BUILD_OPTS": f"{layer_opt}--build-arg BASE_IMAGE={base} --build-arg PIP_NO_INDEX=1 "
                      f"--build-arg PIP_FIND_LINKS={links}",
    }
    result = subprocess.run(["bash", str(REPO / "images" / "build.sh"), "--only", "debian12"],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                            check=False)
    log = result.stdout + result.stderr
    if result.returncode != 0:
        raise RuntimeError(f"images/build.sh failed ({result.returncode}):\n{log[-6000:]}")
    return log


def build_debian_image(buildah: Buildah, work: Path) -> Built:
    """images/build.sh --only debian12, on the mmdebstrap base; raises with the log on failure."""
    tarball, base_seconds = debian_base()
    base_ref = f"localhost/installer-ci-base:debian12-{base_key()}"
    buildah.import_base(tarball, base_ref)
    started = time.monotonic()
    with serve(wheelhouse(work / "wheelhouse")) as links:
        log = run_build_sh(buildah, base_ref, links, timeout=1800)
    ref = next(line.split("--tag ", 1)[1].split()[0] for line in log.splitlines()
               if line.startswith("+ ") and "--tag " in line)
    return Built(ref, buildah.unpack(ref), time.monotonic() - started, base_seconds, log)


def pause_image(work: Path) -> Image:
    """A pause image of our own (tests/lib/pause.c, static): the seeds' pause images cannot be
    pulled here, and all they do is sleep."""
    rootfs = work / "pause-rootfs"
    rootfs.mkdir(parents=True)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(rootfs / "pause"),
                    str(Path(__file__).with_name("pause.c"))], check=True, timeout=120)
    return Image(rootfs, {"Entrypoint": ["/pause"]})
