"""build_repo(): RPMs of the fake driver and a module-stream repository, made with the real
rpmbuild, createrepo_c and modifyrepo_c.

Payload: the kit's own `.run` is built and extracted (so the RPMs carry exactly the files the
runfile tests install), and the kit's kernel modules are compiled with kbuild against this
machine's Debian headers. The packages have the shapes of `shared/reference/dnf-packages.md`:

- `kmod-nvidia-latest-dkms` / `kmod-nvidia-open-dkms` own only `/usr/src/nvidia-<v>/` /
  `/usr/src/nvidia-open-<v>/` (the kit's kernel sources, NVIDIA's `dkms.conf` with
  PACKAGE_NAME="nvidia" in both, and one `<module>.o_binary` object per module, which the kit's
  dkms stand-in links), `Requires: dkms`, and run NVIDIA's scriptlets (`dkms add/build/install
  -m nvidia|nvidia-open ... || :` in %post, `dkms remove --all` in %preun). No `.ko` file is in
  them.
- precompiled `kmod-nvidia-<v>-<kernel version>-<kernel release>` (streams `<branch>`, `latest`)
  ship the modules under /usr/lib64/nvidia/kmod/<k>/, list `/lib/modules/<k>/extra/drivers/
  video/nvidia/*.ko` as %ghost, link them there in %post and run depmod.
- `kernel-devel` is a marker tree per kernel (its `.config` compresses modules on EL9).
- NVIDIA's Fabric Manager package of each version (`nvidia-fabric-manager` up to 575,
  `nvidia-fabricmanager` from 580; Version the driver's, no epoch, release 1), shaped like
  NVIDIA's yum-packaging-fabric-manager: /usr/bin/nv-fabricmanager (the kit's stand-in) and
  nvswitch-audit, /usr/lib/systemd/system/nvidia-fabricmanager.service,
  /usr/share/nvidia/nvswitch/fabricmanager.cfg and the topology files; no scriptlets. Every
  stream's `fm` profile lists it beside the `default` profile's packages.
- NVIDIA's `nvlsm` package, outside the module streams, in two date versions (nvlsm.py).

Every package is signed, as NVIDIA signs its own: with a key made for the entry (gpg), whose
public half lies at the repo's root as `SIGNING_KEY` (NVIDIA's repo has D42D0685.pub there);
the .repo files write_repo_file poses say gpgcheck=1 and name it with gpgkey=.

dnf runs scriptlets chrooted into `--installroot`: the test roots get a shell from extras.py's
`kit-base` package first, and `dkms` from the stand-in EPEL repo (extras.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .. import cache
from ..builder import KIT_DIR, build_runfile
from ..fabricmanager import PAYLOAD as FM_PAYLOAD
from ..fabricmanager import TOPOLOGIES
from . import nvlsm

RPM_DIR = Path(__file__).parent
# A RHEL-shaped kernel release (kernel-devel-<k> must be a valid NEVRA); never loaded here.
KERNEL = "6.1.0-56.el9.x86_64"
KERNEL8 = "4.18.0-553.el8_10.x86_64"
EPOCH = 3
RELEASE = "1.el9"
MODULE = "nvidia-driver"
USERSPACE = ("nvidia-driver", "nvidia-driver-cuda", "nvidia-modprobe")
KMOD = {"proprietary": "kmod-nvidia-latest-dkms", "open": "kmod-nvidia-open-dkms"}
# The name each -dkms kmod registers with DKMS (NVIDIA's dkms-nvidia.spec / dkms-open-nvidia.spec):
# its source dir is /usr/src/<name>-<v>/, its scriptlets run `dkms ... -m <name>`. The open
# package's dkms.conf still says PACKAGE_NAME="nvidia". From 570.148.08 the open kmod registers
# as nvidia too (amazon-eks-ami's al2023 install-nvidia-driver.sh: "The open kernel module name
# changed from nvidia-open to nvidia in 570.148.08").
DKMS_NAME = {"proprietary": "nvidia", "open": "nvidia-open"}
OPEN_RENAMED = (570, 148, 8)


def dkms_name(flavour: str, version: str) -> str:
    """What NVIDIA's `flavour` -dkms kmod of `version` registers with DKMS."""
    if flavour == "open" and tuple(int(p) for p in version.split(".")) >= OPEN_RENAMED:
        return "nvidia"
    return DKMS_NAME[flavour]
HEADERS_TREES = sorted(Path("/usr/src").glob("linux-headers-*-amd64"))
MODULES = ("nvidia", "nvidia-modeset", "nvidia-uvm")
PRECOMPILED_DIR = "/usr/lib64/nvidia/kmod"
FM_RELEASE = "1"  # NVIDIA's Fabric Manager packages: no epoch, no dist tag
SIGNING_KEY = "kit-signing-key.pub"
SIGNER = "Driver installer test kit <kit-rpm@example.invalid>"


def fabricmanager_package(version: str) -> str:
    """NVIDIA renamed the package with the 580 branch."""
    return "nvidia-fabricmanager" if int(version.split(".")[0]) >= 580 else "nvidia-fabric-manager"


@dataclass(frozen=True)
class Release:
    """One driver version in the repo; `conflict` makes its transaction fail its test phase
    (nvidia-modprobe also ships /usr/bin/nvidia-smi, with other content)."""

    version: str
    flavours: tuple[str, ...] = ("proprietary", "open")
    conflict: bool = False
    # The DKMS sources (of both flavours) lack nvidia-uvm's object: every DKMS build fails,
    # make.log says why.
    broken: bool = False
    # Kernels NVIDIA shipped a precompiled (proprietary) kmod of this version for.
    precompiled: tuple[str, ...] = ()


@dataclass(frozen=True)
class RepoSpec:
    releases: tuple[Release, ...]
    # stream -> versions it lists (its flavour comes from the name: *-open and open-dkms)
    streams: tuple[tuple[str, tuple[str, ...]], ...]
    kernels: tuple[str, ...] = (KERNEL, KERNEL8)
    default_stream: str = "latest-dkms"


V565 = "565.57.01"
V570, V575, V580A, V580B = "570.172.08", "575.57.08", "580.105.08", "580.126.20"

DEFAULT_SPEC = RepoSpec(
    releases=(
        Release(V565, broken=True),
        Release(V570, ("proprietary",), precompiled=(KERNEL,)),
        Release(V575, ("proprietary",), conflict=True),
        Release(V580A),
        Release(V580B, precompiled=(KERNEL,)),
    ),
    streams=(
        ("565-dkms", (V565,)),
        ("565-open", (V565,)),
        ("570-dkms", (V570,)),
        ("570", (V570,)),
        ("575-dkms", (V575,)),
        ("580-dkms", (V580A, V580B)),
        ("580-open", (V580A, V580B)),
        ("580", (V580B,)),
        ("latest-dkms", (V570, V580A, V580B)),
        ("open-dkms", (V580A, V580B)),
        ("latest", (V570, V580B)),
    ),
)


def stream_flavour(stream: str) -> str:
    return "open" if stream.endswith("-open") or stream == "open-dkms" else "proprietary"


def is_precompiled(stream: str) -> bool:
    return not stream.endswith(("-dkms", "-open"))


def precompiled_kmod(version: str, kernel: str) -> str:
    """NVIDIA's name: kmod-nvidia-<driver>-<kernel version>-<kernel release without dist>."""
    kversion, _, rest = kernel.partition("-")
    return f"kmod-nvidia-{version}-{kversion}-{rest.split('.el', 1)[0]}"


def nevra(name: str, version: str, arch: str = "x86_64") -> str:
    return f"{name}-{EPOCH}:{version}-{RELEASE}.{arch}"


def build_repo(spec: RepoSpec = DEFAULT_SPEC) -> Path:
    """A directory holding the RPMs and repodata (with modules.yaml) for `spec`, cached like
    the kit's runfiles (see kit.cache). Treat it as read-only."""
    inputs = [
        KIT_DIR / "payload",
        KIT_DIR / "kernel",
        *sorted(KIT_DIR.glob("*.py")),
        *sorted(RPM_DIR.glob("*.py")),
    ]
    key = f"rpmrepo-{cache.tree_digest(inputs)[:12]}-{_digest(repr(spec))[:10]}"
    return cache.cached_dir(key, lambda work: _build(spec, work))


def write_repo_file(path: Path, baseurl: str, repo_id: str = "cuda-rhel9-x86_64", *,
                    signed: bool = True, sslcacert: Path | None = None) -> Path:
    """A .repo file in the shape of NVIDIA's cuda-rhel<N>.repo, pointing at `baseurl`: gpgcheck=1
    and gpgkey= the key at the repo's root (as NVIDIA's names D42D0685.pub beside its repodata).
    `signed=False` for the unsigned stand-in repos a host has of its own (extras.py's EPEL);
    `sslcacert`: the CA of a TLS server on 127.0.0.1."""
    path.parent.mkdir(parents=True, exist_ok=True)
    check = f"gpgcheck=1\ngpgkey={baseurl}/{SIGNING_KEY}\n" if signed else "gpgcheck=0\n"
    tls = f"sslcacert={sslcacert}\n" if sslcacert is not None else ""
    path.write_text(
        f"[{repo_id}]\nname={repo_id}\nbaseurl={baseurl}\nenabled=1\n{check}{tls}"
        "metadata_expire=-1\n"
    )
    return path


# --- building ----------------------------------------------------------------------------


def _build(spec: RepoSpec, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="kit-rpm.") as scratch:
        work = Path(scratch)
        jobs = [(r, f) for r in spec.releases for f in r.flavours]
        with ThreadPoolExecutor(max_workers=2) as pool:
            built = dict(zip(jobs, pool.map(lambda job: _compile(job[0].version, job[1]), jobs)))
        for release in spec.releases:
            stage = work / f"stage-{release.version}"
            _stage_release(release, stage, {f: built[(release, f)] for f in release.flavours})
            _rpmbuild("nvidia-driver", _driver_spec(release, spec.kernels, stage), stage, work, out)
            if release.conflict:
                _rpmbuild("nvidia-modprobe", _conflict_spec(release), stage, work, out)
            fm = fabricmanager_package(release.version)
            _rpmbuild(fm, _fabricmanager_spec(release.version, stage), stage, work, out)
        for version in nvlsm.VERSIONS:
            stage = work / f"stage-nvlsm-{version}"
            nvlsm.stage(version, stage / "nvlsm")
            _rpmbuild("nvlsm", nvlsm.spec(version, spec_head(
                "nvlsm", version, "NVIDIA NVLink Subnet Manager (fake)", release=nvlsm.RELEASE)),
                stage, work, out)
        for kernel in spec.kernels:
            stage = work / f"stage-kernel-{kernel}"
            _stage_kernel(kernel, stage)
            _rpmbuild("kernel-devel", _kernel_spec(kernel, stage), stage, work, out)
        _sign(out)
        subprocess.run(["createrepo_c", "--quiet", str(out)], check=True, capture_output=True)
        modules = out / "modules.yaml"
        modules.write_text(modules_yaml(spec))
        subprocess.run(
            ["modifyrepo_c", "--mdtype=modules", str(modules), str(out / "repodata")],
            check=True,
            capture_output=True,
        )


def _sign(out: Path) -> None:
    """Every RPM under `out` signed with a new key; its public half as out/SIGNING_KEY."""
    with tempfile.TemporaryDirectory(prefix="kit-gpg.") as home:
        env = {**os.environ, "GNUPGHOME": home}

        def gpg(*args: str) -> bytes:
            return subprocess.run(["gpg", "--batch", *args], env=env, check=True,
                                  capture_output=True).stdout

        try:
            gpg("--passphrase", "", "--pinentry-mode", "loopback", "--quick-gen-key", SIGNER,
                "rsa3072", "sign", "never")
            (out / SIGNING_KEY).write_bytes(gpg("--armor", "--export", SIGNER))
            rpms = sorted(str(p) for p in out.rglob("*.rpm"))
            # rpm's default __gpg is gpg2, which Debian does not ship under that name.
            subprocess.run(["rpmsign", "--addsign", "--define", f"__gpg {shutil.which('gpg')}",
                            "--define", f"_gpg_name {SIGNER}", "--define", f"_gpg_path {home}",
                            *rpms], env=env, check=True, capture_output=True,
                           stdin=subprocess.DEVNULL)
        finally:
            subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False,
                           capture_output=True)


def _compile(version: str, flavour: str) -> Path:
    """The kit's modules built by kbuild against this machine's Debian headers (cached on
    their own: they are the slow part, about 6 s each)."""
    if not HEADERS_TREES:
        raise RuntimeError("linux-headers-*-amd64 is not installed")
    headers = HEADERS_TREES[-1]
    key = f"kmod-{version}-{flavour}-{headers.name}-{cache.tree_digest([KIT_DIR / 'kernel'])[:12]}"

    def produce(out: Path) -> None:
        build = out / "build"
        shutil.copytree(KIT_DIR / "kernel", build)
        subprocess.run(
            [
                "make",
                "-s",
                "-C",
                str(headers),
                f"M={build}",
                f"NV_VERSION={version}",
                f"NV_FLAVOUR={flavour}",
                "NV_BUILD_DRM=0",
                "modules",
            ],
            check=True,
            capture_output=True,
        )
        for ko in build.glob("*.ko"):
            shutil.copy2(ko, out / ko.name)
        shutil.rmtree(build)

    return cache.cached_dir(key, produce)


def _stage_release(release: Release, stage: Path, kos: dict[str, Path]) -> None:
    """Files as the packages install them, under stage/<package>/."""
    version = release.version
    run = build_runfile(version, stage / "run")
    extracted = stage / "extracted"
    subprocess.run(
        ["sh", str(run), "--extract-only", "--target", str(extracted)],
        check=True,
        capture_output=True,
    )
    cuda = stage / "nvidia-driver-cuda"
    (cuda / "usr/bin").mkdir(parents=True)
    shutil.copy2(extracted / "nvidia-smi", cuda / "usr/bin/nvidia-smi")
    lib64 = cuda / "usr/lib64"
    lib64.mkdir(parents=True)
    for lib in sorted(extracted.glob(f"lib*.so.{version}")):
        shutil.copy2(lib, lib64 / lib.name)
    # Like NVIDIA's packages, the soname links are shipped too.
    subprocess.run(["ldconfig", "-n", str(lib64)], check=True)
    modprobe = stage / "nvidia-modprobe"
    (modprobe / "usr/bin").mkdir(parents=True)
    shutil.copy2(extracted / "nvidia-modprobe", modprobe / "usr/bin/nvidia-modprobe")
    if release.conflict:
        clash = stage / "nvidia-modprobe-conflict" / "usr/bin"
        clash.mkdir(parents=True)
        shutil.copy2(modprobe / "usr/bin/nvidia-modprobe", clash / "nvidia-modprobe")
        (clash / "nvidia-smi").write_text("#!/bin/sh\necho not the real one\n")
    driver = stage / "nvidia-driver"
    firmware = driver / "lib/firmware/nvidia" / version
    firmware.mkdir(parents=True)
    for blob in sorted((extracted / "firmware").iterdir()):
        shutil.copy2(blob, firmware / blob.name)
    docs = driver / "usr/share/doc/nvidia-driver"
    docs.mkdir(parents=True)
    shutil.copy2(extracted / "LICENSE", docs / "LICENSE")
    for flavour, build in kos.items():
        sources = stage / KMOD[flavour] / "usr/src" / f"{dkms_name(flavour, version)}-{version}"
        shutil.copytree(KIT_DIR / "kernel", sources)
        (sources / "nv-kit.mk").write_text(f"NV_VERSION := {version}\nNV_FLAVOUR := {flavour}\n")
        (sources / "dkms.conf").write_text(dkms_conf(version))
        for name in MODULES:
            if release.broken and name == "nvidia-uvm":
                continue
            shutil.copy2(build / f"{name}.ko", sources / f"{name}.o_binary")
    _stage_fabricmanager(version, stage / fabricmanager_package(version))
    for kernel in release.precompiled:
        objects = stage / precompiled_kmod(version, kernel) / PRECOMPILED_DIR.lstrip("/") / kernel
        objects.mkdir(parents=True)
        for name in MODULES:
            shutil.copy2(kos["proprietary"] / f"{name}.ko", objects / f"{name}.ko")


def _stage_fabricmanager(version: str, package: Path) -> None:
    """The files of NVIDIA's Fabric Manager package (its daemon is the kit's stand-in)."""

    def put(source: str, dest: str, mode: int) -> None:
        path = package / dest.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((FM_PAYLOAD / source).read_text().replace("@VERSION@", version))
        path.chmod(mode)

    put("nv-fabricmanager", "/usr/bin/nv-fabricmanager", 0o755)
    put("nvswitch-audit", "/usr/bin/nvswitch-audit", 0o755)
    put("nvidia-fabricmanager.service", "/usr/lib/systemd/system/nvidia-fabricmanager.service",
        0o644)
    put("fabricmanager.cfg", "/usr/share/nvidia/nvswitch/fabricmanager.cfg", 0o644)
    for name in TOPOLOGIES:
        (package / "usr/share/nvidia/nvswitch" / name).write_text(f"NVFAKE topology {name}\n")


def _fabricmanager_spec(version: str, stage: Path) -> str:
    name = fabricmanager_package(version)
    text = spec_head(name, version, "Fabric Manager for NVSwitch based systems (fake)",
                     release=FM_RELEASE)
    text += f"\n%install\ncp -a %{{_sourcedir}}/{name}/. %{{buildroot}}/\n"
    modes = {"/usr/bin/nv-fabricmanager": "0755", "/usr/bin/nvswitch-audit": "0755"}
    return text + "\n%files\n" + _files(stage / name, modes)


def dkms_conf(version: str) -> str:
    """NVIDIA's dkms.conf: PACKAGE_NAME is "nvidia" for both flavours; MAKE[0] runs the tree's
    own Makefile in DKMS's build dir for ${kernelver}, as NVIDIA's does."""
    lines = [
        'PACKAGE_NAME="nvidia"',
        f'PACKAGE_VERSION="{version}"',
        'AUTOINSTALL="yes"',
        "MAKE[0]=\"'make' -j$(nproc) NV_EXCLUDE_KERNEL_MODULES='nvidia-drm' "
        'KERNEL_UNAME=${kernelver} modules"',
    ]
    for index, name in enumerate(MODULES):
        lines += [f'BUILT_MODULE_NAME[{index}]="{name}"', f'DEST_MODULE_LOCATION[{index}]="/extra"']
    return "\n".join(lines) + "\n"


def _stage_kernel(kernel: str, stage: Path) -> None:
    """A marker header tree (no kernel to compile against exists); its .config says whether the
    kernel's modules are xz-compressed, as EL9's is."""
    devel = stage / "kernel-devel" / "usr/src/kernels" / kernel
    (devel / "include/generated").mkdir(parents=True)
    (devel / "Makefile").write_text(f"# kernel-devel marker tree for {kernel} (test kit)\n")
    xz = "y" if ".el9" in kernel else "n"
    (devel / ".config").write_text(f"CONFIG_MODULES=y\nCONFIG_MODULE_COMPRESS_XZ={xz}\n")
    (devel / "include/generated/utsrelease.h").write_text(f'#define UTS_RELEASE "{kernel}"\n')
    headers = stage / "kernel-headers" / "usr/include/linux"
    headers.mkdir(parents=True)
    (headers / "version.h").write_text(f"/* kernel-headers marker for {kernel} (test kit) */\n")


_SPEC_HEAD = """\
%define debug_package %{{nil}}
%define __os_install_post %{{nil}}
%define __strip /bin/true
%define _build_id_links none
Name: {name}
Version: {version}
Release: {release}
{epoch}Summary: {summary}
License: MIT
AutoReqProv: no
{requires}
%description
{summary} (installer test kit; not NVIDIA software).
"""


def spec_head(name: str, version: str, summary: str, *, release: str = "1", epoch: str = "",
              requires: str = "") -> str:
    """_SPEC_HEAD filled in; `epoch` and `requires` are whole lines ("Epoch: 1\\n") or empty."""
    return _SPEC_HEAD.format(name=name, version=version, release=release, epoch=epoch,
                             summary=summary, requires=requires)


def _files(root: Path, modes: dict[str, str] | None = None) -> str:
    lines = []
    for path in sorted(p for p in root.rglob("*") if not p.is_dir()):
        host = "/" + str(path.relative_to(root))
        mode = (modes or {}).get(host)
        lines.append(f"%attr({mode},root,root) {host}" if mode else host)
    return "\n".join(lines) + "\n"


def _driver_spec(release: Release, kernels: tuple[str, ...], stage: Path) -> str:
    """One spec per version: nvidia-driver and the others as subpackages (-n)."""
    v = release.version
    evr = f"{EPOCH}:{v}-{RELEASE}"
    req_kmod = f"Requires: nvidia-kmod = {evr}\nRequires: nvidia-driver-cuda = {evr}\n"
    text = spec_head("nvidia-driver", v, "NVIDIA driver (fake)", release=RELEASE,
                     epoch=f"Epoch: {EPOCH}\n", requires=req_kmod)
    subs = [
        ("nvidia-driver-cuda", "CUDA driver and nvidia-smi (fake)", ""),
        ("nvidia-modprobe", "nvidia-modprobe (fake)", ""),
    ]
    for flavour in release.flavours:
        other = KMOD["open" if flavour == "proprietary" else "proprietary"]
        subs.append(
            (
                KMOD[flavour],
                f"{flavour} kernel module sources for DKMS (fake)",
                f"Provides: nvidia-kmod = {evr}\nConflicts: {other}\nRequires: dkms\n",
            )
        )
    for kernel in release.precompiled:
        kversion = kernel.rsplit(".", 1)[0]
        subs.append(
            (
                precompiled_kmod(v, kernel),
                f"precompiled proprietary kernel modules for {kernel} (fake)",
                f"Provides: nvidia-kmod = {evr}\nConflicts: {KMOD['proprietary']}\n"
                f"Conflicts: {KMOD['open']}\nRequires: (kernel = {kversion} if kernel)\n",
            )
        )
    for name, summary, extra in subs:
        text += f"\n%package -n {name}\nSummary: {summary}\nAutoReqProv: no\n{extra}\n"
        text += f"%description -n {name}\n{summary} (installer test kit).\n"
    text += "\n%install\n"
    names = ["nvidia-driver"] + [s[0] for s in subs]
    for name in names:
        text += f"cp -a %{{_sourcedir}}/{name}/. %{{buildroot}}/\n"
    for kernel in release.precompiled:
        text += f"mkdir -p %{{buildroot}}{_ghost_dir(kernel)}\n"
        text += "".join(f"touch %{{buildroot}}{_ghost_dir(kernel)}/{m}.ko\n" for m in MODULES)
    return text + _scriptlets(release) + _files_sections(release, stage)


def _ghost_dir(kernel: str) -> str:
    return f"/lib/modules/{kernel}/extra/drivers/video/nvidia"


def _scriptlets(release: Release) -> str:
    """NVIDIA's: the -dkms kmods swallow every DKMS error (`|| :`) and build only for the
    running kernel; the precompiled kmods link their modules in and run depmod."""
    v = release.version
    text = ""
    for flavour in release.flavours:
        name = dkms_name(flavour, v)
        text += (
            f"\n%post -n {KMOD[flavour]}\n"
            f"dkms add -m {name} -v {v} -q || :\n"
            "# Rebuild and make available for the currently running kernel\n"
            f"dkms build -m {name} -v {v} -q || :\n"
            f"dkms install -m {name} -v {v} -q --force || :\n"
            f"\n%preun -n {KMOD[flavour]}\n"
            "# Remove all versions from DKMS registry\n"
            f"dkms remove -m {name} -v {v} -q --all || :\n"
        )
    for kernel in release.precompiled:
        text += f"\n%post -n {precompiled_kmod(v, kernel)}\n"
        for name in MODULES:
            text += f"ln -f {PRECOMPILED_DIR}/{kernel}/{name}.ko {_ghost_dir(kernel)}/{name}.ko\n"
        text += f"depmod -a {kernel} || :\n"
        text += f"\n%postun -n {precompiled_kmod(v, kernel)}\ndepmod -a {kernel} || :\n"
    return text


def _files_sections(release: Release, stage: Path) -> str:
    text = "\n%files\n" + _files(stage / "nvidia-driver")
    names = ["nvidia-driver-cuda", "nvidia-modprobe", *(KMOD[f] for f in release.flavours)]
    modes = {"/usr/bin/nvidia-modprobe": "4755"}
    for name in names:
        files = _files(stage / name, modes)
        for flavour, kmod in KMOD.items():
            if name == kmod:
                files = (f"%dir /usr/src/{dkms_name(flavour, release.version)}-{release.version}\n"
                         + files)
        text += f"\n%files -n {name}\n" + files
    for kernel in release.precompiled:
        name = precompiled_kmod(release.version, kernel)
        text += f"\n%files -n {name}\n" + _files(stage / name)
        text += f"%dir {_ghost_dir(kernel)}\n"
        text += "".join(f"%ghost {_ghost_dir(kernel)}/{m}.ko\n" for m in MODULES)
    return text


def _conflict_spec(release: Release) -> str:
    """A second build of nvidia-modprobe whose /usr/bin/nvidia-smi differs from the one in
    nvidia-driver-cuda: dnf's test transaction refuses the pair before touching anything."""
    v = release.version
    text = spec_head("nvidia-modprobe", v, "nvidia-modprobe (fake)", release=RELEASE,
                     epoch=f"Epoch: {EPOCH}\n")
    text += "\n%install\ncp -a %{_sourcedir}/nvidia-modprobe-conflict/. %{buildroot}/\n"
    return text + (
        "\n%files\n%attr(4755,root,root) /usr/bin/nvidia-modprobe\n/usr/bin/nvidia-smi\n"
    )


def _kernel_spec(kernel: str, stage: Path) -> str:
    version, _, rest = kernel.partition("-")
    release = rest.rsplit(".", 1)[0]
    text = spec_head("kernel-devel", version, f"kernel-devel marker for {kernel}", release=release)
    text += (
        f"\n%package -n kernel-headers\nSummary: kernel-headers marker\n\n"
        f"%description -n kernel-headers\nkernel-headers marker for {kernel}.\n"
    )
    text += (
        "\n%install\ncp -a %{_sourcedir}/kernel-devel/. %{buildroot}/\n"
        "cp -a %{_sourcedir}/kernel-headers/. %{buildroot}/\n"
    )
    return (
        text
        + "\n%files\n"
        + _files(stage / "kernel-devel")
        + "\n%files -n kernel-headers\n"
        + _files(stage / "kernel-headers")
    )


def _rpmbuild(name: str, text: str, stage: Path, work: Path, out: Path) -> None:
    spec_file = stage / f"{name}.spec"
    spec_file.write_text(text)
    top = work / f"top-{stage.name}-{name}"
    result = subprocess.run(
        [
            "rpmbuild",
            "-bb",
            "--quiet",
            "--target",
            "x86_64",
            "--define",
            f"_topdir {top}",
            "--define",
            f"_sourcedir {stage}",
            "--define",
            "_binary_payload w1.gzdio",
            "--define",
            "_rpmdir %{_topdir}/RPMS",
            str(spec_file),
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"rpmbuild {spec_file} failed:\n{result.stderr[-3000:]}")
    for rpm in (top / "RPMS").rglob("*.rpm"):
        shutil.move(str(rpm), out / rpm.name)


def modules_yaml(spec: RepoSpec) -> str:
    """modulemd v2 documents: one per (stream, driver version), and the module's defaults."""
    docs = []
    for stream, versions in spec.streams:
        flavour = stream_flavour(stream)
        for index, version in enumerate(sorted(versions, key=_vkey)):
            release = next(r for r in spec.releases if r.version == version)
            if is_precompiled(stream):
                names = list(USERSPACE)
                kmods = [precompiled_kmod(version, k) for k in release.precompiled]
            else:
                names = kmods = [*USERSPACE, KMOD[flavour]]
            listed = dict.fromkeys([*names, *kmods])
            fm = fabricmanager_package(version)
            artifacts = "".join(f"    - {nevra(n, version)}\n" for n in listed)
            artifacts += f"    - {fm}-0:{version}-{FM_RELEASE}.x86_64\n"
            artifacts += f"    - {nevra('nvidia-driver', version, 'src')}\n"
            docs.append(
                "---\ndocument: modulemd\nversion: 2\ndata:\n"
                f'  name: {MODULE}\n  stream: "{stream}"\n  version: {index + 1}\n'
                f'  context: "{_context(stream)}"\n  arch: x86_64\n'
                f"  summary: Nvidia driver for {stream} branch\n"
                f"  description: >-\n    Fake NVIDIA driver {version} ({flavour}) for tests.\n"
                "  license:\n    module:\n    - MIT\n"
                "  profiles:\n    default:\n      rpms:\n"
                + "".join(f"      - {n}\n" for n in names)
                + "    fm:\n      rpms:\n"
                + "".join(f"      - {n}\n" for n in [*names, fm])
                + "    src:\n      rpms:\n      - nvidia-driver\n"
                "  artifacts:\n    rpms:\n" + artifacts + "...\n"
            )
    docs.append(
        "---\ndocument: modulemd-defaults\nversion: 1\ndata:\n"
        f'  module: {MODULE}\n  stream: "{spec.default_stream}"\n  profiles:\n'
        + "".join(f'    "{s}": [default]\n' for s, _ in spec.streams)
        + "...\n"
    )
    return "".join(docs)


def _context(stream: str) -> str:
    return _digest(stream)[:8]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))
