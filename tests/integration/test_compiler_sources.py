"""The kernel's gcc from the image's own package sources: a kernel built with a gcc
the image lacks gets it installed in the container, before the driver download, when the image's
list of its sources' compilers (written at image build time) names it; never on a bare host."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from lib.hostkit import installer_env, make_debian_host, run_installer
from lib.httpfaults import serve_directory

VERSION = "580.105.08"
# What the Debian 12 image's build writes from `apt-cache --names-only search '^gcc-[0-9]+$'`.
BOOKWORM_LIST = "11 gcc-11 /usr/bin/gcc-11\n12 gcc-12 /usr/bin/gcc-12\n"


def built_with_gcc(root: Path, kernel: str, version: int) -> None:
    """The host's headers say their kernel was built with gcc `version` (e.g. 110400). The tree
    is hard-linked to this machine's headers: the file is replaced, never written through."""
    conf = root / f"usr/src/linux-headers-{kernel}/include/config/auto.conf"
    text = conf.read_text()
    conf.unlink()
    lines = [f"CONFIG_GCC_VERSION={version}" if line.startswith("CONFIG_GCC_VERSION=") else line
             for line in text.splitlines()]
    conf.write_text("\n".join(lines) + "\n")


def apt_get_without(package: str, bin_dir: Path, log: Path) -> None:
    """apt-get as in an image whose sources lack `package`: `update` works, `install` answers
    what apt-get answers then (exit 100, "Unable to locate package")."""
    bin_dir.mkdir()
    script = bin_dir / "apt-get"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {shlex.quote(str(log))}\n'
        'case "$1" in update) exit 0 ;; esac\n'
        'echo "Reading package lists..."\n'
        f'echo "E: Unable to locate package {package}" >&2\n'
        "exit 100\n")
    script.chmod(0o755)


@pytest.fixture()
def host(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "host"
    kernel = make_debian_host(root)
    built_with_gcc(root, kernel, 110400)
    return root, kernel


def test_plan_names_the_package_and_run_installs_it_before_the_download(
        host: tuple[Path, str], tmp_path: Path) -> None:
    root, kernel = host
    listed = tmp_path / "compiler-packages"
    listed.write_text(BOOKWORM_LIST)
    log = tmp_path / "apt-get.log"
    apt_get_without("gcc-11", tmp_path / "bin", log)
    (tmp_path / "www").mkdir()
    with serve_directory(tmp_path / "www") as (base, requests):
        env = installer_env(root, kernel, NVIDIA_DRIVER_VERSION=VERSION,
                            NVIDIA_DRIVER_MIRRORS=base,
                            NVIDIA_INSTALLER_COMPILER_PACKAGES=str(listed),
                            PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
        plan = run_installer(env, "plan")
        assert plan.returncode == 0, plan.stderr[-2000:]
        assert "compiler: install gcc-11" in plan.stdout, plan.stdout
        assert "gcc-11 from the image's package sources (apt-get in the container" in plan.stdout
        assert not log.exists()  # plan changes nothing

        result = run_installer(env, "run")

    assert result.returncode == 45, result.stderr[-3000:]
    assert "error[compiler-install-failed]" in result.stderr
    assert "E: Unable to locate package gcc-11" in result.stderr
    assert "ubuntu22.04 or rocky9" in result.stderr  # the tags that carry gcc-11
    assert log.read_text().splitlines() == ["update -q",
                                            "install -y -q --no-install-recommends gcc-11"]
    assert requests == []  # failed before the driver download


def test_without_the_images_list_nothing_is_installed(host: tuple[Path, str],
                                                      tmp_path: Path) -> None:
    """A run on a host (no image, no list): compiler-missing, and no package manager call."""
    root, kernel = host
    log = tmp_path / "apt-get.log"
    apt_get_without("gcc-11", tmp_path / "bin", log)
    env = installer_env(root, kernel, NVIDIA_DRIVER_VERSION=VERSION,
                        NVIDIA_DRIVER_MIRRORS="http://127.0.0.1:9",
                        NVIDIA_INSTALLER_COMPILER_PACKAGES=str(tmp_path / "absent"),
                        PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    plan = run_installer(env, "plan")
    assert "compiler: missing" in plan.stdout, plan.stdout
    result = run_installer(env, "run")
    assert result.returncode == 43, result.stderr[-3000:]
    assert "error[compiler-missing]" in result.stderr
    assert not log.exists()
