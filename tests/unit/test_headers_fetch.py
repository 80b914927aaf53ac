"""What the private apt and dnf read of the host: sources, keys, repos, vault; and the plan's
account of where headers and the compiler come from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from lib.fakes import FakeRunner
from lib.hosttrees import make_host

from installer.config import from_env
from installer.distros import apt, dnf
from installer.headers import fetch
from installer.host import distro_from_os_release, gather
from installer.hostroot import HostRoot

K = "5.15.0-105-generic"


def test_one_line_sources_keep_binary_entries_and_reroot_signed_by(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    text = ("deb [arch=amd64 signed-by=/usr/share/keyrings/ubuntu.gpg] http://archive.ubuntu.com/"
            "ubuntu jammy main restricted # comment\n"
            "deb-src http://archive.ubuntu.com/ubuntu jammy main\n"
            "deb cdrom:[Ubuntu 22.04]/ jammy main\n"
            "# deb http://commented.example/ubuntu jammy main\n"
            "deb http://security.ubuntu.com/ubuntu jammy-security main\n")
    assert apt.rewrite_one_line(text, root, None) == (
        f"deb [arch=amd64 signed-by={tmp_path}/usr/share/keyrings/ubuntu.gpg] "
        "http://archive.ubuntu.com/ubuntu jammy main restricted\n"
        "deb http://security.ubuntu.com/ubuntu jammy-security main\n")
    assert apt.rewrite_one_line(text, root, "http://mirror.local/ubuntu").splitlines()[1] == (
        "deb http://mirror.local/ubuntu jammy-security main")


def test_deb822_sources_drop_deb_src_reroot_keys_and_take_the_mirror(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    os.makedirs(tmp_path / "usr/share/keyrings")
    os.symlink("/etc/keys/ubuntu.gpg", tmp_path / "usr/share/keyrings/ubuntu-archive-keyring.gpg")
    text = ("Types: deb deb-src\nURIs: http://archive.ubuntu.com/ubuntu/\n"
            "Suites: noble noble-updates\nComponents: main\n"
            "Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n\n"
            "Types: deb-src\nURIs: http://archive.ubuntu.com/ubuntu/\nSuites: noble\n"
            "Components: main\n")
    out = apt.rewrite_deb822(text, root, "http://mirror.local/ubuntu")
    assert out == ("Types: deb\nURIs: http://mirror.local/ubuntu\nSuites: noble noble-updates\n"
                   f"Components: main\nSigned-By: {tmp_path}/etc/keys/ubuntu.gpg\n\n"
                   "Types: deb\nEnabled: no\nURIs: http://mirror.local/ubuntu\nSuites: noble\n"
                   "Components: main\n")


def test_private_apt_reads_the_hosts_sources_and_keys_and_writes_only_its_own_dirs(
        tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "etc/apt/sources.list.d").mkdir(parents=True)
    (host / "etc/apt/sources.list").write_text("deb http://a.example/ubuntu jammy main\n")
    (host / "etc/apt/sources.list.d/extra.sources").write_text(
        "Types: deb\nURIs: http://b.example/\nSuites: x\nComponents: main\n")
    (host / "etc/apt/sources.list.d/notes.txt").write_text("ignored by apt\n")
    root = HostRoot(host)
    assert [str(p) for p in apt.source_files(root)] == [
        "/etc/apt/sources.list", "/etc/apt/sources.list.d/extra.sources"]
    private = apt.prepare(root, tmp_path / "work", "x86_64", None)
    argv = private.argv("apt-get", "update")
    assert argv[0] == "apt-get" and argv[-1] == "update"
    options = dict(o[2:].split("=", 1) for o in argv[1:-1])
    assert options["Dir::Etc::TrustedParts"] == f"{host}/etc/apt/trusted.gpg.d"
    assert options["Dir::Etc::Trusted"] == f"{host}/etc/apt/trusted.gpg"
    assert options["Dir::State::status"] == f"{tmp_path}/work/status"
    assert options["Dir::State"] == f"{tmp_path}/work/state"
    assert options["Dir::Cache"] == f"{tmp_path}/work/cache"
    assert options["APT::Architecture"] == "amd64"
    assert sorted(os.listdir(tmp_path / "work/sources.list.d")) == [
        "00-sources.list", "01-extra.sources"]
    assert (tmp_path / "work/status").read_text() == ""
    assert sorted(os.listdir(host / "etc/apt")) == ["sources.list", "sources.list.d"]


def test_header_packages_follow_ubuntus_and_debians_header_dependencies() -> None:
    private = apt.PrivateApt(Path("/w"), ())
    runner = FakeRunner().on("apt-cache", "depends", output="")
    runner.on("apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts",
              "--no-breaks", "--no-replaces", "--no-enhances", f"linux-headers-{K}",
              output=f"linux-headers-{K}\n  Depends: linux-headers-5.15.0-105\n"
              "  Depends: libc6\n  Depends: libelf1\n |Depends: linux-kbuild-6.1\n")
    runner.on("apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts",
              "--no-breaks", "--no-replaces", "--no-enhances", "linux-headers-5.15.0-105",
              output="linux-headers-5.15.0-105\n")
    runner.on("apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts",
              "--no-breaks", "--no-replaces", "--no-enhances", "linux-kbuild-6.1",
              output="linux-kbuild-6.1\n  Depends: libc6\n")
    assert apt.header_packages(runner, private, f"linux-headers-{K}") == [
        f"linux-headers-{K}", "linux-headers-5.15.0-105", "linux-kbuild-6.1"]
    missing = FakeRunner().on("apt-cache", returncode=100, output="E: No packages found")
    assert apt.header_packages(missing, private, "linux-headers-x") is None


def test_repo_files_reroot_keys_and_certificates_and_take_the_mirror(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    text = ("[rhel-9-for-x86_64-appstream-rpms]\nname = RHEL 9 AppStream\n"
            "baseurl = https://cdn.redhat.com/content/dist/rhel9/$releasever/x86_64/appstream/os\n"
            "enabled = 1\ngpgcheck = 1\n"
            "gpgkey = file:///etc/pki/rpm-gpg/RPM-GPG-KEY-redhat-release\n"
            "sslcacert = /etc/rhsm/ca/redhat-uep.pem\n"
            "sslclientcert = /etc/pki/entitlement/1.pem\n"
            "sslclientkey = /etc/pki/entitlement/1-key.pem\n"
            "metalink = https://example.invalid/metalink\n")
    out = dnf.rewrite_repos(text, root, None)
    assert f"gpgkey = file://{tmp_path}/etc/pki/rpm-gpg/RPM-GPG-KEY-redhat-release" in out
    assert f"sslclientcert = {tmp_path}/etc/pki/entitlement/1.pem" in out
    assert f"sslcacert = {tmp_path}/etc/rhsm/ca/redhat-uep.pem" in out
    assert "skip_if_unavailable = 1" in out and "metalink" in out
    mirrored = dnf.rewrite_repos(text, root, "http://mirror.local/el9/")
    assert "baseurl = http://mirror.local/el9/rhel-9-for-x86_64-appstream-rpms/" in mirrored
    assert "metalink" not in mirrored
    assert dnf.enabled_keys([out]) == [f"{tmp_path}/etc/pki/rpm-gpg/RPM-GPG-KEY-redhat-release"]


@pytest.mark.parametrize(("kernel", "version_id", "minor"), [
    ("4.18.0-513.24.1.el8_9.x86_64", "8.10", "8.9"),
    ("5.14.0-427.13.1.el9_4.x86_64", "9.5", "9.4"),
    ("5.14.0-570.12.1.el9.x86_64", "9.6", "9.6"),
])
def test_the_vault_minor_comes_from_the_kernel(kernel: str, version_id: str, minor: str) -> None:
    distro = distro_from_os_release(f'ID=rocky\nVERSION_ID="{version_id}"\n', "os-release")
    assert dnf.kernel_minor(kernel, distro) == minor
    repos = dnf.vault_repos("http://vault.local/rocky", minor, "file:///k")
    assert f"baseurl=http://vault.local/rocky/{minor}/AppStream/$basearch/os/" in repos
    assert f"baseurl=http://vault.local/rocky/{minor}/BaseOS/$basearch/os/" in repos


def test_releasever_is_the_hosts_lock_or_its_major(tmp_path: Path) -> None:
    distro = distro_from_os_release('ID=rhel\nVERSION_ID="9.4"\n', "os-release")
    root = HostRoot(tmp_path)
    assert dnf.releasever(root, distro) == "9"
    (tmp_path / "etc/dnf/vars").mkdir(parents=True)
    (tmp_path / "etc/dnf/vars/releasever").write_text("9.2\n")
    assert dnf.releasever(root, distro) == "9.2"


def _plan_source(root: Path, kernel: str, **env: str) -> fetch.SourcePlan:
    config = from_env({"ROOT_MOUNT_DIR": str(root), **env})
    facts = gather(HostRoot(root), kernel_override=kernel, free_space_path=root)
    return fetch.plan_source(HostRoot(root), config, facts)


def test_plan_source_says_why_headers_cannot_be_had(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    make_host(tmp_path, distro="ubuntu-20.04", kernel="5.4.0-200-generic")
    monkeypatch.setattr(fetch.shutil, "which", lambda name: f"/usr/bin/{name}")
    empty = _plan_source(tmp_path, "5.4.0-200-generic")
    assert empty.tool is None and "the host has no package sources" in empty.where
    off = _plan_source(tmp_path, "5.4.0-200-generic", NVIDIA_INSTALLER_FETCH_HEADERS="false")
    assert off.tool is None and "NVIDIA_INSTALLER_FETCH_HEADERS=false" in off.where
    (tmp_path / "etc/apt").mkdir(parents=True)
    (tmp_path / "etc/apt/sources.list").write_text("deb http://archive.ubuntu.com/ubuntu focal "
                                                   "main\n")
    mirror = _plan_source(tmp_path, "5.4.0-200-generic",
                          NVIDIA_INSTALLER_HEADERS_MIRROR="http://user:pw@mirror.local/ubuntu")
    assert mirror.tool == "apt-get" and mirror.package == "linux-headers-5.4.0-200-generic"
    assert mirror.where == ("the mirror http://mirror.local/ubuntu (in place of the URIs in "
                            "/etc/apt/sources.list)")
    monkeypatch.setattr(fetch.shutil, "which", lambda name: None)
    no_tool = _plan_source(tmp_path, "5.4.0-200-generic")
    assert no_tool.tool is None and "this image has no apt-get" in no_tool.where


def _runfile_context(tmp_path: Path, runner: FakeRunner, **env: str) -> Any:
    from installer.config import from_env as config_from
    from installer.host import gather as gather_facts
    from installer.layout import Layout
    from installer.plan import Context, Target

    root = make_host(tmp_path, distro="ubuntu-20.04", kernel="5.4.0-200-generic", gpus=[0x2330])
    (tmp_path / "proc/version").write_text(
        "Linux version 5.4.0-200-generic (buildd@lcy02-amd64-023) (gcc version 9.4.0 (Ubuntu "
        "9.4.0-1ubuntu1~20.04.2)) #220-Ubuntu SMP\n")
    config = config_from({"ROOT_MOUNT_DIR": str(tmp_path), **env})
    target = Target("580.105.08", 580, "open", "5.4.0-200-generic", "runfile", [], None, True,
                    ("0000:00:04.0",))

    def no_fetch(urls: list[str], dest: Path, name: str) -> Path:
        raise AssertionError("the driver must not be downloaded")

    return Context(config, root, Layout.from_config(config, root), runner,
                   gather_facts(root, free_space_path=tmp_path), target, no_fetch)


def test_headers_and_compiler_are_settled_before_the_driver_download(tmp_path: Path) -> None:
    from installer.sources.runfile import source as runfile_source

    ctx = _runfile_context(tmp_path, FakeRunner())
    names = [step.name for step in runfile_source.runfile_steps(ctx)]
    assert names[:3] == ["kernel-headers", "check-compiler", "fetch-runfile"]


def test_missing_headers_stop_the_run_before_the_download(tmp_path: Path) -> None:
    from installer import pipeline
    from installer.errors import KernelHeadersMissing
    from installer.plan import Plan
    from installer.sources.runfile import source as runfile_source

    ctx = _runfile_context(tmp_path, FakeRunner().on("gcc", "-dumpversion", output="9.4.0\n"),
                           NVIDIA_INSTALLER_FETCH_HEADERS="false")
    with pytest.raises(KernelHeadersMissing, match=r"linux-headers-5\.4\.0-200-generic: fetching "
                       r"is off"):
        pipeline.execute(Plan(ctx, [], runfile_source.runfile_steps(ctx)))


def test_a_compiler_the_image_lacks_stops_the_run_before_fetching_headers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from installer import pipeline
    from installer.errors import CompilerMissing
    from installer.headers import compiler
    from installer.plan import Plan
    from installer.sources.runfile import source as runfile_source

    monkeypatch.setattr(compiler.shutil, "which",
                        lambda name: "/usr/bin/gcc" if name == "gcc" else None)
    runner = FakeRunner().on("gcc", "-dumpversion", output="12\n")
    ctx = _runfile_context(tmp_path, runner)
    with pytest.raises(CompilerMissing, match=r"built with gcc 9 \(/proc/version\)") as info:
        pipeline.execute(Plan(ctx, [], runfile_source.runfile_steps(ctx)))
    assert info.value.hint == ("Compiler gcc-9: use the installer image tag ubuntu20.04, which "
                               "carries gcc-9.")
    assert [c.argv[0] for c in runner.calls] == ["gcc"] * len(runner.calls)
    assert not (tmp_path / "var/lib/nvidia/cache/headers").exists()
