"""The Debian 12 product image for linux/amd64 and linux/arm64 as one manifest list, built for real
by images/build.sh with buildah: both bases from mmdebstrap, the arm64 RUN steps under qemu-user."""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib
from lib.podimage import (
    IMAGE_PYTHON,
    REPO,
    Buildah,
    base_key,
    cache_dir,
    debian_base,
    run_build_sh,
    serve,
    wheelhouse,
)
from lib.podspec import Image

PLATFORMS = ("linux/amd64", "linux/arm64")
FINISHED = "build-finished"  # in a CachedBuildah's storage
CACHED = "localhost/installer-ci-layer"  # the tag that keeps a cached step's image
BINFMT = Path("/proc/sys/fs/binfmt_misc")
# Debian 12's glibc is 2.36; pip takes these tags literally, so each manylinux level is named.
AARCH64_WHEEL_TAGS = ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64",
                      "manylinux_2_34_aarch64", "linux_aarch64")


def binfmt_problem() -> str | None:
    """Why arm64 binaries cannot run here (scripts/binfmt-qemu's own words where it refused), or
    None when qemu-aarch64 is registered and enabled."""
    entry = BINFMT / "qemu-aarch64"
    try:
        if entry.read_text().splitlines()[0] == "enabled":
            return None
        state = f"{entry} is registered but disabled"
    except OSError:
        state = (f"qemu-aarch64 is not registered in {BINFMT}" if (BINFMT / "register").exists()
                 else f"binfmt_misc is not mounted on {BINFMT}")
    note = cache_dir() / "binfmt-qemu.refused"
    said = note.read_text().strip() if note.is_file() else ""
    return (f"{state}, so the arm64 image's RUN steps cannot run: scripts/install-deps runs "
            f"scripts/binfmt-qemu (as root) to fix it" + (f"; it said: {said}" if said else ""))


def multiarch_wheelhouse(dest: Path) -> Path:
    """The amd64 wheelhouse plus the aarch64 wheels of the compiled dependencies (cryptography,
    cffi, PyYAML, ...): pip in the arm64 wheels stage takes those from the same links."""
    wheelhouse(dest)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    tags = [arg for tag in AARCH64_WHEEL_TAGS for arg in ("--platform", tag)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest),
         "--only-binary=:all:", "--python-version", IMAGE_PYTHON, *tags,
         *project["project"]["dependencies"]],
        check=True, capture_output=True, timeout=600,
    )
    return dest


class CachedBuildah(Buildah):
    """buildah whose vfs storage stays in the CI cache between runs, one per key: the bases
    (tagged) and the layers of the steps that do not change from commit to commit (`--layers`:
    both stages' apt steps, an hour of arm64 emulation on a cold cache). A new key (a new week's
    bases, an edited Dockerfile, another buildah) starts an empty storage and removes the old.
    A CI run can be killed at its time limit anywhere: each run first takes away what an earlier
    one left (`repair`). Two runs on one machine (CI beside a developer's run) take turns: the
    storage's lock is held from the sweep to `release` (a killed run's lock goes with its
    process)."""

    def __init__(self) -> None:
        cache_dir().mkdir(parents=True, exist_ok=True)
        self._lock = (cache_dir() / "multiarch-buildah.lock").open("a")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        dockerfile = (REPO / "images/ubuntu/Dockerfile").read_bytes()
        version = subprocess.run(["buildah", "--version"], capture_output=True, text=True,
                                 check=True, timeout=60).stdout
        inputs = json.dumps([base_key(), base_key("arm64"), version,
                             hashlib.sha256(dockerfile).hexdigest()])
        key = hashlib.sha256(inputs.encode()).hexdigest()[:16]
        super().__init__(cache_dir() / f"multiarch-buildah-{key}")
        for stale in cache_dir().glob("multiarch-buildah-*"):
            if stale != self.storage:
                subprocess.run(["buildah", "--root", str(stale / "root"), "--runroot",
                                str(stale / "run"), "--storage-driver", "vfs", "rm", "--all"],
                               capture_output=True, check=False, timeout=600)
                shutil.rmtree(stale, ignore_errors=True)
        self.repair()

    def repair(self) -> None:
        """A run killed midway left its working containers, its manifest list (whose name the
        next `manifest create` refuses: "already associated with image") and images, perhaps a
        base list without both platforms: all go, as `remove` takes them at a run's end. A
        storage buildah can no longer read (a full disk, a commit cut short) starts afresh."""
        try:
            self.remove()
            json.loads(self("images", "--all", "--json") or "[]")
            self("rm", self("from", "scratch"))  # a write buildah must be able to undo
        except (subprocess.SubprocessError, ValueError, KeyError):
            shutil.rmtree(self.storage, ignore_errors=True)

    def release(self) -> None:
        """The next run on this machine may take the storage."""
        self._lock.close()

    def finished_once(self) -> bool:
        """A build with this storage ran to its end before: every cached step is there (a run
        killed midway leaves some of them, and the next one runs the rest)."""
        return (self.storage / FINISHED).is_file()

    def mark_finished(self) -> None:
        (self.storage / FINISHED).touch()

    def has_list(self, ref: str) -> bool:
        """`ref` is a base list holding an image of each platform (an import cut short leaves
        a list without them: that one goes, and the bases are imported again)."""
        shown = subprocess.run([*self.argv, "manifest", "inspect", ref], capture_output=True,
                               text=True, check=False, timeout=60)
        if shown.returncode != 0:
            return False
        try:
            arches = {entry["platform"]["architecture"]
                      for entry in json.loads(shown.stdout).get("manifests") or []}
        except (ValueError, KeyError, TypeError):
            arches = set()
        if arches == {platform.split("/")[1] for platform in PLATFORMS}:
            return True
        subprocess.run([*self.argv, "manifest", "rm", ref], capture_output=True, check=False,
                       timeout=60)
        return False

    def remove(self) -> None:
        """The working containers and every image of this commit go; the bases and the layers
        of the steps before the first COPY, LABEL or stage mount stay, tagged (removing an image
        also removes its untagged parents)."""
        subprocess.run([*self.argv, "rm", "--all"], capture_output=True, check=False, timeout=600)
        doomed = []
        for image in json.loads(self("images", "--all", "--json") or "[]"):
            names = image.get("names") or []
            if any(name.startswith(("localhost/installer-ci-base:", f"{CACHED}:"))
                   for name in names):
                continue
            if names:  # this run's manifest list and images
                doomed.append(image["id"])
                for name in names:
                    subprocess.run([*self.argv, "manifest", "rm", name], capture_output=True,
                                   check=False, timeout=600)
                continue
            history = json.loads(self("inspect", "--type", "image", image["id"]))["OCIv1"].get(
                "history") or []
            steps = " ".join(entry.get("created_by", "") for entry in history)
            if any(word in steps for word in ("COPY ", "LABEL ", "--mount=")):
                doomed.append(image["id"])
            else:
                self("tag", image["id"], f"{CACHED}:{image['id']}")
        for image_id in doomed:
            subprocess.run([*self.argv, "rmi", "--force", image_id], capture_output=True,
                           check=False, timeout=600)


@dataclass
class ManifestList:
    ref: str
    manifest: dict[str, object]        # `buildah manifest inspect`
    images: dict[str, Image]           # platform -> the image's root and OCI config
    seconds: float                     # images/build.sh, both platforms
    cached_steps: int                  # images of cached steps in the storage before the build
    warm: bool                         # an earlier build with this storage finished
    base_seconds: dict[str, float]     # mmdebstrap per arch (0 where cached)
    log: str


def import_bases(buildah: Buildah) -> tuple[str, dict[str, float]]:
    """Both mmdebstrap tarballs as images of their architecture, in one local manifest list:
    `FROM ${BASE_IMAGE}` with --platform then picks the matching base."""
    listed = f"localhost/installer-ci-base:debian12-{base_key()}-{base_key('arm64')}"
    seconds = {}
    if isinstance(buildah, CachedBuildah) and buildah.has_list(listed):
        return listed, {platform.split("/")[1]: 0.0 for platform in PLATFORMS}
    buildah("manifest", "create", listed)
    for platform in PLATFORMS:
        arch = platform.split("/")[1]
        tarball, seconds[arch] = debian_base(arch)
        ref = f"localhost/installer-ci-base:debian12-{arch}-{base_key(arch)}"
        container = buildah("from", "scratch")
        buildah("add", container, str(tarball), "/")
        buildah("config", "--arch", arch, "--os", "linux", "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--cmd", "bash", container)
        buildah("commit", "--rm", container, ref)
        buildah("manifest", "add", listed, f"containers-storage:{ref}")
    return listed, seconds


def unpack_platform(buildah: Buildah, ref: str, digest: str, arch: str) -> Image:
    """The manifest list's image `digest` mounted as a working container's root."""
    image_id = next(line.split()[0] for line in buildah(
        "images", "--no-trunc", "--digests", "--format", "{{.ID}} {{.Digest}}").splitlines()
        if line.split()[1:] == [digest])
    container = buildah("from", "--name", f"multiarch-{arch}", image_id)
    config = json.loads(buildah("inspect", "--type", "image", image_id))["OCIv1"]
    return Image(Path(buildah("mount", container)), {**config["config"],
                                                     "architecture": config["architecture"]})


def build_manifest_list(buildah: Buildah, work: Path) -> ManifestList:
    """images/build.sh --only debian12 with PLATFORMS=linux/amd64,linux/arm64; raises with the
    log on failure."""
    base, base_seconds = import_bases(buildah)
    cached_steps = sum(name.startswith(f"{CACHED}:") for image in json.loads(
        buildah("images", "--all", "--json") or "[]") for name in image.get("names") or [])
    started = time.monotonic()
    with serve(multiarch_wheelhouse(work / "wheelhouse")) as links:
        log = run_build_sh(buildah, base, links, timeout=5400, platforms=PLATFORMS, layers=True)
    seconds = time.monotonic() - started
    ref = next(line.split(" manifest create ", 1)[1].strip() for line in log.splitlines()
               if line.startswith("+ ") and " manifest create " in line)
    manifest = json.loads(buildah("manifest", "inspect", ref))
    images = {}
    for entry in manifest["manifests"]:
        arch = entry["platform"]["architecture"]
        images[f"linux/{arch}"] = unpack_platform(buildah, ref, entry["digest"], arch)
    warm = buildah.finished_once() if isinstance(buildah, CachedBuildah) else False
    if isinstance(buildah, CachedBuildah):
        buildah.mark_finished()
    return ManifestList(ref, manifest, images, seconds, cached_steps, warm, base_seconds, log)
