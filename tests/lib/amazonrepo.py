"""Amazon Linux 2023 for the dnf source's tests: NVIDIA's amzn2023 repo (the kit's driver RPMs,
its nvidia-driver module streams, and dkms, which on AL2023 comes from that repo, not EPEL) and
the AL2023 core repo's kernel packages, each signed by its own key as the real ones are.

Where each shape comes from:
- NVIDIA's repo: developer.download.nvidia.com/compute/cuda/repos/amzn2023/<arch>/ with
  cuda-amzn2023.repo (repo id cuda-amzn2023-<arch>); the nvidia-driver streams as in its rhel
  repos (amazon-eks-ami's al2023 install-nvidia-driver.sh resolves `nvidia-driver:570-open` with
  `dnf module provides` there, and NVIDIA's driver installation guide lists AL2023 beside
  RHEL 8/9 for `dnf module enable nvidia-driver:<branch>-open`); dkms (noarch) in its x86_64
  folder only (the same script installs it with `--enablerepo="cuda*"`, and on arm64 adds the
  x86_64 folder to get it).
- AL2023's kernels: `kernel-devel`, `kernel-headers`, `kernel-modules-extra` for the 6.1 line,
  `kernel6.12-*` for 6.12 (amazon-eks-ami installs `${KERNEL_PACKAGE}-devel -headers
  -modules-extra`), version-release the uname release without the arch; the tree in
  /usr/src/kernels/<uname -r> as every EL-shaped kernel-devel.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kit.rpm import RepoSpec, build_extras, build_repo, modules_yaml, write_repo_file

from lib.headerrepos import KEY_NAME, Key, make_key, run, stop_agent

NVIDIA_REPO_ID = "cuda-amzn2023-x86_64"


def nvidia_repo(work: Path, spec: RepoSpec, *, with_dkms: bool = True) -> tuple[Path, Key]:
    """NVIDIA's amzn2023 x86_64 folder: the kit's driver RPMs for `spec` (no kernel-devel: that
    is Amazon's) and, `with_dkms`, the dkms package, all signed with one new key whose public
    half lies at the folder's root as `key.pub`; repodata with modules.yaml."""
    built = build_repo(spec)
    out = work / ("nvidia" if with_dkms else "nvidia-no-dkms")
    out.mkdir(parents=True)
    for rpm in sorted(built.glob("*.rpm")):
        shutil.copy2(rpm, out / rpm.name)
    if with_dkms:
        for rpm in sorted((build_extras() / "epel").glob("dkms-*.rpm")):
            shutil.copy2(rpm, out / rpm.name)
    key = make_key(work / f"key-{out.name}")
    _sign(sorted(out.glob("*.rpm")), key)
    shutil.copy2(key.armored, out / "key.pub")
    run("createrepo_c", "--quiet", str(out))
    (work / "modules.yaml").write_text(modules_yaml(spec))
    run("modifyrepo_c", "--mdtype=modules", str(work / "modules.yaml"), str(out / "repodata"))
    return out, key


def nvidia_repo_file(path: Path, folder: Path) -> Path:
    """cuda-amzn2023.repo as NVIDIA writes it (gpgcheck=1, its key beside the repodata),
    pointing at `folder` over file://."""
    written = write_repo_file(path, f"file://{folder}", NVIDIA_REPO_ID)
    text = written.read_text().replace(f"file://{folder}/kit-signing-key.pub",
                                       f"file://{folder}/key.pub")
    written.write_text(text)
    return written


def kernel_packages(work: Path, kernel: str, key: Key) -> list[Path]:
    """The line's -devel (a configured tree DKMS finds), -headers and -modules-extra of
    `kernel`, one rpmbuild, signed with `key` (Amazon's)."""
    line = kernel_line(kernel)
    version, release = kernel.rsplit(".", 1)[0].split("-", 1)
    arch = kernel.rsplit(".", 1)[1]
    stage = work / f"stage-{kernel}"
    tree = stage / "devel/usr/src/kernels" / kernel
    (tree / "include/generated").mkdir(parents=True)
    (tree / "Makefile").write_text(f"# {line}-devel tree for {kernel} (test archive)\n")
    # AL2023 compresses no modules; DKMS reads this to decide.
    (tree / ".config").write_text("CONFIG_MODULES=y\nCONFIG_GCC_VERSION=110500\n")
    (tree / "include/generated/utsrelease.h").write_text(f'#define UTS_RELEASE "{kernel}"\n')
    headers = stage / "headers/usr/include/linux"
    headers.mkdir(parents=True)
    (headers / "version.h").write_text(f"/* {line}-headers marker for {kernel} */\n")
    extra = stage / "modules-extra/lib/modules" / kernel / "kernel/drivers/gpu/drm"
    extra.mkdir(parents=True)
    (extra / "README.test").write_text("where the DRM helpers nvidia-drm needs would be\n")
    spec = stage / f"{line}.spec"
    subs = ""
    for part in ("devel", "headers", "modules-extra"):
        files = sorted("/" + str(p.relative_to(stage / part))
                       for p in (stage / part).rglob("*") if p.is_file())
        subs += (f"%package -n {line}-{part}\nSummary: {line}-{part} (test archive)\n"
                 f"%description -n {line}-{part}\n{line}-{part} of {kernel}.\n"
                 f"%files -n {line}-{part}\n" + "\n".join(files) + "\n")
    spec.write_text(
        f"Name: {line}\nVersion: {version}\nRelease: {release}\nSummary: {line} (test)\n"
        "License: GPLv2\nAutoReqProv: no\n%description\nTest archive copy.\n"
        f"%install\nfor part in devel headers modules-extra; do "
        f"cp -a {stage}/$part/. %{{buildroot}}/; done\n" + subs)
    top = work / f"rpmbuild-{kernel}"
    run("rpmbuild", "-bb", "--quiet", f"--target={arch}", f"--define=_topdir {top}",
        "--define=_binary_payload w1.gzdio", "--define=_build_id_links none",
        "--define=__os_install_post %{nil}", "--define=debug_package %{nil}", str(spec))
    rpms = sorted((top / "RPMS").rglob("*.rpm"))
    _sign(rpms, key)
    return rpms


def kernel_line(kernel: str) -> str:
    line = ".".join(kernel.split("-", 1)[0].split(".")[:2])
    return "kernel" if line == "6.1" else f"kernel{line}"


def _sign(rpms: list[Path], key: Key) -> None:
    # --addsign replaces the signature the kit gave its packages (rpm >= 4.14).
    subprocess.run(["rpmsign", "--addsign", f"--define=_gpg_path {key.home}",
                    "--define=__gpg /usr/bin/gpg", f"--define=_gpg_name {KEY_NAME}",
                    *map(str, rpms)], check=True, capture_output=True, stdin=subprocess.DEVNULL)
    stop_agent(key.home)
