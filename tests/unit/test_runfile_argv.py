from __future__ import annotations

from pathlib import Path, PurePosixPath

from installer.config import from_env
from installer.release.download import download_urls
from installer.sources.runfile.argv import (
    BuildRequest,
    build_modules_argv,
    extract_argv,
    install_userspace_argv,
    module_type_args,
)

DEFAULT = "https://us.download.nvidia.com/tesla/550.54.15/NVIDIA-Linux-x86_64-550.54.15.run"


def test_explicit_url_is_the_only_candidate() -> None:
    config = from_env(
        {
            "NVIDIA_DRIVER_DOWNLOAD_URL": "file:///srv/x.run",
            "NVIDIA_DRIVER_MIRRORS": "http://127.0.0.1:1/m",
        }
    )
    assert download_urls(config, "550.54.15", "x86_64", DEFAULT) == ["file:///srv/x.run"]


def test_mirrors_come_first_in_order_then_the_default() -> None:
    config = from_env({"NVIDIA_DRIVER_MIRRORS": "http://127.0.0.1:1/m/,http://127.0.0.1:2"})
    assert download_urls(config, "550.54.15", "x86_64", DEFAULT) == [
        "http://127.0.0.1:1/m/550.54.15/NVIDIA-Linux-x86_64-550.54.15.run",
        "http://127.0.0.1:2/550.54.15/NVIDIA-Linux-x86_64-550.54.15.run",
        DEFAULT,
    ]


def test_extract_uses_nvidias_spelling() -> None:
    assert extract_argv(Path("/c/x.run"), Path("/c/e"), Path("/c/tmp")) == [
        "sh",
        "/c/x.run",
        "--extract-only",
        "--target",
        "/c/e",
        "--tmpdir",
        "/c/tmp",
    ]


def test_module_type_flag_depends_on_the_branch() -> None:
    assert module_type_args("580.105.08", "open") == ["--kernel-module-type=open"]
    assert module_type_args("550.54.15", "open") == ["-m=kernel-open"]
    assert module_type_args("535.183.01", "proprietary") == ["-m=kernel"]


def test_build_argv_builds_only_modules_into_the_cache() -> None:
    request = BuildRequest(
        extracted=Path("/c/extracted/580.105.08"),
        version="580.105.08",
        kernel="6.1.0-56-amd64",
        flavour="open",
        kernel_source="/usr/src/linux-headers-6.1.0-56-common",
        kernel_output="/usr/src/linux-headers-6.1.0-56-amd64",
        install_path=Path("/c/modules/x"),
        log_file=Path("/i/build.log"),
        tmpdir=Path("/c/tmp"),
        signing_key=Path("/root/k.priv"),
        signing_cert=Path("/root/k.der"),
        jobs=2,
    )
    assert build_modules_argv(request) == [
        "/c/extracted/580.105.08/nvidia-installer",
        "--silent",
        "--accept-license",
        "--kernel-modules-only",
        "--kernel-name=6.1.0-56-amd64",
        "--kernel-source-path=/usr/src/linux-headers-6.1.0-56-common",
        "--kernel-output-path=/usr/src/linux-headers-6.1.0-56-amd64",
        "--kernel-install-path=/c/modules/x",
        "--kernel-module-type=open",
        "--no-drm",
        "--skip-module-load",
        "--skip-depmod",
        "--no-nouveau-check",
        "--no-rebuild-initramfs",
        "--override-file-type-destination=FIRMWARE:/c/tmp/firmware-of-module-pass",
        "--concurrency-level=2",
        "--log-file-name=/i/build.log",
        "--tmpdir=/c/tmp",
        "--module-signing-secret-key=/root/k.priv",
        "--module-signing-public-key=/root/k.der",
    ]


def test_userspace_argv_sets_every_destination_under_the_prefix() -> None:
    argv = install_userspace_argv(
        Path("/e"), Path("/i/versions/.v.tmp"), Path("/i/log"), Path("/t")
    )
    assert argv[:4] == [
        "/e/nvidia-installer",
        "--silent",
        "--accept-license",
        "--no-kernel-modules",
    ]
    prefixes = [a for a in argv if "prefix=" in a or "path=" in a or "destination=" in a]
    assert prefixes, argv
    for arg in prefixes:
        assert "/i/versions/.v.tmp" in arg, arg
    assert "--utility-libdir=lib64" in argv and "--opengl-libdir=lib64" in argv
    assert PurePosixPath("/i/log").as_posix() in argv[-2]
