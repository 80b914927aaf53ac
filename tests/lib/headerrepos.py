"""Signed package repositories of kernel headers, shaped like Debian's, Ubuntu's and Rocky's, and
host roots whose package sources point at them (served on 127.0.0.1 by the tests)."""

from __future__ import annotations

import atexit
import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lib.hostkit import debian_headers

DEB_DIRS = (Path(os.environ.get("INSTALLER_TEST_DEBS", "/var/cache/installer-test/debs")),
            Path("/var/cache/apt/archives"))
KEY_NAME = "installer test archive <archive@example.invalid>"


def run(*argv: str, cwd: Path | None = None) -> str:
    done = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Key:
    """A throwaway signing key: its gpg home, its public keyring (binary, as apt wants) and its
    public key armored (as dnf's gpgkey= wants)."""

    home: Path
    keyring: Path
    armored: Path


def make_key(dest: Path) -> Key:
    # gpg-agent's sockets live in the home: under pytest-xdist's deeper temp paths one in `dest`
    # passes the 108-byte limit of a socket path and the agent cannot start. A short home in
    # the temp dir instead, removed when the process ends.
    dest.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="gnupg."))
    atexit.register(shutil.rmtree, home, True)
    run("gpg", "--homedir", str(home), "--batch", "--passphrase", "", "--quick-gen-key",
        KEY_NAME, "rsa2048", "sign", "never")
    keyring = dest / "archive-keyring.gpg"
    keyring.write_bytes(subprocess.run(["gpg", "--homedir", str(home), "--export"],
                                       capture_output=True, check=True).stdout)
    run("gpg", "--homedir", str(home), "--armor", "--export", "--output", str(dest / "key.asc"))
    stop_agent(home)
    return Key(home, keyring, dest / "key.asc")


def stop_agent(home: Path) -> None:
    """gpg starts an agent per home dir for secret-key work; leave none running."""
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False,
                   capture_output=True)


def _link_copy(src: Path, dest: Path) -> None:
    """A real copy (hard links would let tar see ctimes change when other processes link the
    same system files)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)


# --- apt --------------------------------------------------------------------------------


def real_debian_debs(kernel: str) -> list[Path] | None:
    """Debian's own header packages of the installed headers (apt's cache or install-deps')."""
    base = kernel.removesuffix("-amd64")
    kbuild = ".".join(base.split(".")[:2])
    names = (f"linux-headers-{kernel}_", f"linux-headers-{base}-common_", f"linux-kbuild-{kbuild}_")
    for directory in DEB_DIRS:
        found = [sorted(directory.glob(f"{n}*.deb")) for n in names] if directory.is_dir() else []
        if found and all(found):
            return [f[-1] for f in found]
    return None


def publish_apt(www: Path, suite: str, debs: list[Path], key: Key, arch: str = "amd64") -> None:
    """A Debian-style archive: pool/, dists/<suite>/main/binary-<arch>/Packages(.gz), and a
    Release with its hashes, signed as InRelease and Release.gpg."""
    pool = www / "pool/main"
    pool.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        if not (pool / deb.name).exists():
            os.link(deb, pool / deb.name) if deb.stat().st_dev == pool.stat().st_dev else (
                shutil.copy2(deb, pool / deb.name))
    dist = www / "dists" / suite
    binary = dist / "main" / f"binary-{arch}"
    binary.mkdir(parents=True, exist_ok=True)
    packages = run("dpkg-scanpackages", "--multiversion", "pool/main", "/dev/null", cwd=www)
    (binary / "Packages").write_text(packages)
    (binary / "Packages.gz").write_bytes(gzip.compress(packages.encode(), mtime=0))
    lines = [
        "Origin: installer-test", "Label: installer-test", f"Suite: {suite}",
        f"Codename: {suite}",
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}",
        f"Architectures: {arch}", "Components: main", "SHA256:",
    ]
    for path in sorted(binary.iterdir()):
        data = path.read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} "
                     f"{path.relative_to(dist)}")
    release = dist / "Release"
    release.write_text("\n".join(lines) + "\n")
    for out in ("InRelease", "Release.gpg"):
        (dist / out).unlink(missing_ok=True)
    gpg = ("gpg", "--homedir", str(key.home), "--batch", "--yes")
    run(*gpg, "--clearsign", "--output", str(dist / "InRelease"), str(release))
    run(*gpg, "--detach-sign", "--armor", "--output", str(dist / "Release.gpg"), str(release))
    stop_agent(key.home)


def build_deb(tree: Path, out: Path, control: dict[str, str]) -> Path:
    """dpkg-deb of `tree` with the given control fields (uncompressed: a test archive)."""
    (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (tree / "DEBIAN/control").write_text("".join(f"{k}: {v}\n" for k, v in control.items()))
    deb = out / f"{control['Package']}_{control['Version']}_{control['Architecture']}.deb"
    out.mkdir(parents=True, exist_ok=True)
    run("dpkg-deb", "--root-owner-group", "-Znone", "--build", str(tree), str(deb))
    return deb


def ubuntu_shape_debs(work: Path, kernel: str, base_package: str, gcc_version: int) -> list[Path]:
    """Ubuntu's two packages from the real Debian header trees: `linux-headers-<kernel>` (the
    flavour's generated files, its own kbuild scripts, relative links for the rest) depending
    on `base_package` (the common tree in /usr/src/<base_package>), as Ubuntu lays them out.
    `gcc_version` (e.g. 110400) is the CONFIG_GCC_VERSION the flavour's config records."""
    found = debian_headers()
    assert found is not None
    _, (arch_tree, common_tree, kbuild_tree) = found
    version = kernel.rsplit("-", 1)[0] + ".1"
    base = work / "base"
    base_dir = base / "usr/src" / base_package
    _link_copy(Path(common_tree), base_dir)
    flavour = work / "flavour"
    flavour_dir = flavour / "usr/src" / f"linux-headers-{kernel}"
    flavour_dir.mkdir(parents=True)
    for entry in Path(arch_tree).iterdir():
        if entry.name in ("Makefile", "scripts", "tools"):
            continue
        dest = flavour_dir / entry.name
        if entry.is_dir():
            shutil.copytree(entry, dest, symlinks=True)
        else:
            shutil.copy2(entry, dest)
    for name in ("scripts", "tools"):
        shutil.copytree(Path(kbuild_tree) / name, flavour_dir / name, symlinks=True)
    _link_into(base_dir, flavour_dir, base_dir, flavour_dir)
    _set_release(flavour_dir, kernel)
    for config in (flavour_dir / ".config", flavour_dir / "include/config/auto.conf"):
        text = config.read_text()
        lines = [f"CONFIG_GCC_VERSION={gcc_version}" if line.startswith("CONFIG_GCC_VERSION=")
                 else line for line in text.splitlines()]
        config.write_text("\n".join(lines) + "\n")
    return ubuntu_header_pair(work / "debs", base, flavour, kernel, base_package, version,
                              "amd64", "libelf1",
                              "Header files related to Linux kernel (test archive)")


def ubuntu_header_pair(out: Path, base: Path, flavour: Path, kernel: str, common: str,
                       version: str, deb_arch: str, libelf: str, description: str) -> list[Path]:
    """Ubuntu's two header packages built into `out`: `common` (Architecture: all) from the
    tree under `base`, and linux-headers-<kernel> from the tree under `flavour` (given here its
    /lib/modules/<kernel>/build link) depending on `common`, libc6 and `libelf`."""
    modules = flavour / "lib/modules" / kernel
    modules.mkdir(parents=True)
    os.symlink(f"/usr/src/linux-headers-{kernel}", modules / "build")
    fields = {"Version": version, "Maintainer": "test <test@example.invalid>",
              "Section": "devel", "Priority": "optional", "Description": description}
    return [
        build_deb(base, out, {"Package": common, "Architecture": "all", **fields}),
        build_deb(flavour, out, {"Package": f"linux-headers-{kernel}",
                                 "Architecture": deb_arch,
                                 "Depends": f"{common}, libc6 (>= 2.34), {libelf}", **fields}),
    ]


def _link_into(common: Path, flavour: Path, common_top: Path, flavour_top: Path) -> None:
    """Ubuntu links the common tree's entries into the flavour's own dirs (`include/linux ->
    ../../linux-headers-<base>/include/linux` beside the flavour's `include/generated`), so
    the flavour tree alone is a whole tree: kernel.h is found in it. Links are
    relative between the two trees as installed side by side in /usr/src."""
    for entry in sorted(common.iterdir()):
        dest = flavour / entry.name
        if dest.is_dir() and not dest.is_symlink() and entry.is_dir():
            _link_into(entry, dest, common_top, flavour_top)
        elif not dest.exists() and not dest.is_symlink():
            installed_entry = Path("/usr/src") / common_top.name / entry.relative_to(common_top)
            installed_dir = Path("/usr/src") / flavour_top.name / flavour.relative_to(flavour_top)
            os.symlink(os.path.relpath(installed_entry, installed_dir), dest)


def deb822_ubuntu_sources(root: Path, key: Key, keyring_name: str, stanza: str) -> None:
    """Ubuntu 24.04's layout: `key` as /usr/share/keyrings/<keyring_name>, sources.list left
    with only its "moved" note, and ubuntu.sources holding `stanza` signed by that keyring."""
    keyring = root / "usr/share/keyrings" / keyring_name
    keyring.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(key.keyring, keyring)
    parts = root / "etc/apt/sources.list.d"
    parts.mkdir(parents=True, exist_ok=True)
    (root / "etc/apt/sources.list").write_text(
        "# Ubuntu sources have moved to /etc/apt/sources.list.d/ubuntu.sources\n")
    (parts / "ubuntu.sources").write_text(
        f"{stanza}Signed-By: /usr/share/keyrings/{keyring_name}\n")


def apt_sources(root: Path, base: str, suite: str, key: Key, *, deb822: bool) -> None:
    """The host's sources pointing at `base`: Ubuntu 24.04's deb822 file with Signed-By, or the
    one-line sources.list with the key in trusted.gpg.d (Ubuntu 20.04/22.04, Debian 12)."""
    if deb822:
        deb822_ubuntu_sources(root, key, "test-archive-keyring.gpg",
                              f"Types: deb deb-src\nURIs: {base}\nSuites: {suite} {suite}-updates\n"
                              "Components: main\n")
    else:
        trusted = root / "etc/apt/trusted.gpg.d"
        trusted.mkdir(parents=True, exist_ok=True)
        shutil.copy2(key.keyring, trusted / "test-archive.gpg")
        (root / "etc/apt/sources.list").write_text(
            f"deb {base} {suite} main\n# deb-src {base} {suite} main\n"
            f"deb {base} {suite}-updates main\n")


# --- dnf --------------------------------------------------------------------------------


def _set_release(tree: Path, kernel: str) -> None:
    """The tree's UTS_RELEASE made the posed kernel's, as the distribution's own tree has it
    (kbuild writes it into each module's vermagic)."""
    uts = tree / "include/generated/utsrelease.h"
    uts.unlink()
    uts.write_text(f'#define UTS_RELEASE "{kernel}"\n')


def kernel_devel_rpm(work: Path, kernel: str, key: Key, package: str = "kernel-devel") -> Path:
    """`package`-<kernel> (kernel-devel; Oracle's kernel-uek-devel, ...) as EL ships it: one flat
    tree in /usr/src/kernels/<kernel> (the real Debian trees merged: top Makefile, generated
    files, built kbuild scripts), signed with `key`."""
    found = debian_headers()
    assert found is not None
    _, (arch_tree, common_tree, kbuild_tree) = found
    tree = work / "tree"
    dest = tree / "usr/src/kernels" / kernel
    _link_copy(Path(common_tree), dest)
    for entry in Path(arch_tree).iterdir():
        if entry.name in ("Makefile", "scripts", "tools"):
            continue
        target = dest / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(entry, target)
    for name in ("scripts", "tools"):
        if (dest / name).is_symlink():
            (dest / name).unlink()
        shutil.copytree(Path(kbuild_tree) / name, dest / name, symlinks=True, dirs_exist_ok=True)
    _set_release(dest, kernel)
    return signed_devel_rpm(work / f"{package}.spec", work / "rpmbuild", package, kernel, dest,
                            key, "x86_64")


def signed_devel_rpm(spec: Path, top: Path, package: str, kernel: str, tree: Path, key: Key,
                     arch: str) -> Path:
    """`package` (kernel-devel, kernel-uek-devel, ...) of `kernel`'s version and release for
    `arch`: `tree` as /usr/src/kernels/<kernel>, built under `top` and signed with `key`. A
    +64k kernel's package has the 4k kernel's NVR."""
    version, release = kernel.removesuffix("+64k").rsplit(".", 1)[0].split("-", 1)
    spec.write_text(f"""Name: {package}
Version: {version}
Release: {release}
Summary: Development package for building kernel modules to match the kernel
License: GPLv2
AutoReqProv: no
%description
Test archive copy.
%install
mkdir -p %{{buildroot}}/usr/src/kernels
cp -a {tree} %{{buildroot}}/usr/src/kernels/
%files
/usr/src/kernels/{kernel}
""")
    run("rpmbuild", "-bb", "--quiet", f"--target={arch}", f"--define=_topdir {top}",
        "--define=_binary_payload w1.gzdio", "--define=_build_id_links none",
        "--define=__os_install_post %{nil}", "--define=debug_package %{nil}", str(spec))
    rpm = next((top / "RPMS").rglob("*.rpm"))
    run("rpmsign", "--addsign", f"--define=_gpg_path {key.home}", "--define=__gpg /usr/bin/gpg",
        f"--define=_gpg_name {KEY_NAME}", str(rpm))
    stop_agent(key.home)
    return rpm


def publish_dnf(www: Path, rpms: list[Path]) -> None:
    www.mkdir(parents=True, exist_ok=True)
    for rpm in rpms:
        shutil.copy2(rpm, www / rpm.name)
    run("createrepo_c", "--quiet", str(www))


def rocky_repos(root: Path, major: int, base: str, key: Key, repos: dict[str, str]) -> None:
    """Rocky's repo files (`[baseos]`, `[appstream]`: id -> URL path) and its key in
    /etc/pki/rpm-gpg, as rocky-repos installs them."""
    key_name = "RPM-GPG-KEY-rockyofficial" if major == 8 else f"RPM-GPG-KEY-Rocky-{major}"
    pki = root / "etc/pki/rpm-gpg"
    pki.mkdir(parents=True, exist_ok=True)
    shutil.copy2(key.armored, pki / key_name)
    lines = []
    for repo_id, path in repos.items():
        lines += [f"[{repo_id}]", f"name=Rocky Linux $releasever - {repo_id}",
                  f"baseurl={base}/{path}", "gpgcheck=1", "enabled=1", "countme=1",
                  f"gpgkey=file:///etc/pki/rpm-gpg/{key_name}", ""]
    (root / "etc/yum.repos.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/yum.repos.d/rocky.repo").write_text("\n".join(lines))
    (root / "etc/dnf/vars").mkdir(parents=True, exist_ok=True)
    (root / "etc/dnf/vars/contentdir").write_text("pub/rocky\n")


# --- zypper -----------------------------------------------------------------------------


def suse_devel_rpms(work: Path, kernel: str) -> list[Path]:
    """SUSE's two header packages of `kernel` (6.4.0-150600.23.25-default), posed small and
    unsigned (the signed repo metadata is what zypper checks): kernel-<flavour>-devel with the
    flavour's configured tree in /usr/src/linux-<ver>-obj/x86_64/<flavour> and
    /lib/modules/<kernel>/{build,source} links, requiring the noarch kernel-devel with the sources'
    tree in /usr/src/linux-<ver>. Each rpm's release has the rebuild counter (.1) uname -r lacks
    and provides its name at the version without it, as SUSE's do. Posed, not checked against a
    real SLES package: that the `source` link ships in the flavour's devel package, and the
    obj Makefile's relative include."""
    version, flavour = kernel.rsplit("-", 1)
    upstream, release = version.split("-", 1)
    source, obj = f"/usr/src/linux-{version}", f"/usr/src/linux-{version}-obj/x86_64/{flavour}"
    modules = f"/lib/modules/{kernel}"
    specs = {
        "kernel-devel": ("noarch", "", [
            f"mkdir -p %{{buildroot}}{source}/include/linux",
            f"echo '/* posed */' > %{{buildroot}}{source}/include/linux/kernel.h",
            f"echo 'VERSION = {upstream.split('.')[0]}' > %{{buildroot}}{source}/Makefile",
        ], [source]),
        f"kernel-{flavour}-devel": ("x86_64", f"Requires: kernel-devel = {version}", [
            f"mkdir -p %{{buildroot}}{obj}/include/generated/uapi/linux %{{buildroot}}{modules}",
            f"echo 'include ../../../linux-{version}/Makefile' > %{{buildroot}}{obj}/Makefile",
            f"echo '#define LINUX_VERSION_CODE 394240' > "
            f"%{{buildroot}}{obj}/include/generated/uapi/linux/version.h",
            f"echo 'CONFIG_GCC_VERSION=70500' > %{{buildroot}}{obj}/.config",
            f"ln -s {obj} %{{buildroot}}{modules}/build",
            f"ln -s {source} %{{buildroot}}{modules}/source",
        ], [f"/usr/src/linux-{version}-obj", modules]),
    }
    rpms = []
    work.mkdir(parents=True, exist_ok=True)
    for name, (arch, requires, script, files) in specs.items():
        top = work / f"rpmbuild-{name}"
        spec = work / f"{name}.spec"
        newline = "\n"
        spec.write_text(f"""Name: {name}
Version: {upstream}
Release: {release}.1
Summary: Development files of the kernel (test archive)
License: GPL-2.0-only
BuildArch: {arch}
AutoReqProv: no
Provides: {name} = {version}
{requires}
%description
Test archive copy.
%install
{newline.join(script)}
%files
{newline.join(files)}
""")
        run("rpmbuild", "-bb", "--quiet", f"--define=_topdir {top}",
            "--define=_binary_payload w1.gzdio", "--define=_build_id_links none",
            "--define=__os_install_post %{nil}", "--define=debug_package %{nil}", str(spec))
        rpms.append(next((top / "RPMS").rglob("*.rpm")))
    return rpms


def sign_repomd(www: Path, key: Key, *, offer_key: bool = False) -> None:
    """Sign an rpm-md repo's repodata/repomd.xml as SUSE's repos are (repomd.xml.asc, detached
    and armored); `offer_key` publishes the public key beside it (repomd.xml.key), which zypper
    offers to import, as SUSE's repos do."""
    repomd = www / "repodata/repomd.xml"
    run("gpg", "--homedir", str(key.home), "--batch", "--yes", "--detach-sign", "--armor",
        "--output", str(repomd.with_name("repomd.xml.asc")), str(repomd))
    stop_agent(key.home)
    if offer_key:
        shutil.copy2(key.armored, repomd.with_name("repomd.xml.key"))
