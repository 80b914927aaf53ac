"""The host releases the tests pose, as data (tests/lib/hosts/<id>-<version>.json, one file per
release: its os-release, its kernels with the headers package and flavour each names, its image
tag, what its kernels' /proc/version says of their gcc, files it ships), so a new release is a
new file and not a new test file. unsupported.json lists the releases refused, each with the
nearest supported release its refusal names.

A kernel with a `name` and a `proc_version` is a posed host of the integration tier
(tests/integration/test_host_releases*.py, test id its name): a whole root of the release running
it on `arch`, its headers package served from the release's repos on 127.0.0.1 (`repo`, one of
the release's `repos`, for the EL families; Ubuntu's archive by suite and architecture). Every
field beyond the first three of a kernel and the first four of a release is optional."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest

HOSTS = Path(__file__).parent / "hosts"


class Kernel(NamedTuple):
    """A kernel of the release and what the release's family names for it."""

    release: str
    headers_package: str
    flavour: str
    name: str = ""  # a posed host's name (its test id)
    arch: str = ""  # the machine it runs on
    common_package: str = ""  # Ubuntu: the common headers package its headers Depend on
    gcc: int | None = None  # the gcc major it was built with (/proc/version, its config)
    proc_version: str = ""  # its /proc/version line
    page_kib: int | None = None  # its headers' CONFIG_ARM64_*K_PAGES (arm64 only)
    repo: str = ""  # EL: the server path of the repo that serves its headers package

    @property
    def package_name(self) -> str:
        """The headers package's name without its version (kernel-64k-devel's is the 4k
        release's)."""
        return self.headers_package.split(f"-{self.release.removesuffix('+64k')}")[0]


@dataclass(frozen=True)
class HostRelease:
    name: str  # the file's stem: <id>-<version_id>
    id: str
    version_id: str
    image_tag: str
    kernels: tuple[Kernel, ...]
    pretty_name: str = ""
    proc_version: str = ""  # a kernel's /proc/version line, for the gcc it was built with
    gcc: int | None = None
    gcc_tags: tuple[str, ...] = ()  # every image tag that carries that gcc, where it is pinned
    image_compilers: tuple[int, ...] = ()  # the gcc majors the release's image tag carries
    dnf_kernels: tuple[tuple[str, str], ...] = ()  # (kernel, its package line) for DKMS
    files: dict[str, str] = field(default_factory=dict)  # host path (no leading /) -> text
    codename: str = ""  # os-release's VERSION_CODENAME (Ubuntu's suite)
    repos: tuple[str, ...] = ()  # EL: the server paths of every repo its repo files name
    driver_version: str = ""  # the driver the integration tier installs there, if not its own


class PosedHost(NamedTuple):
    """A whole host the integration tier poses: the release running one of its kernels."""

    release: HostRelease
    kernel: Kernel


def _without_notes(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if not key.startswith("note")}


def _release(path: Path) -> HostRelease:
    data = _without_notes(json.loads(path.read_text()))
    return HostRelease(
        name=path.stem,
        kernels=tuple(Kernel(**_without_notes(kernel)) for kernel in data.pop("kernels")),
        repos=tuple(data.pop("repos", ())),
        gcc_tags=tuple(data.pop("gcc_tags", ())),
        image_compilers=tuple(data.pop("image_compilers", ())),
        dnf_kernels=tuple((row["release"], row["line"]) for row in data.pop("dnf_kernels", ())),
        **data)


def releases() -> list[HostRelease]:
    return [_release(path) for path in sorted(HOSTS.glob("*.json"))
            if path.name != "unsupported.json"]


def release(name: str) -> HostRelease:
    return _release(HOSTS / f"{name}.json")


def posed_hosts() -> dict[str, PosedHost]:
    """Every posed host of every release, by name."""
    return {kernel.name: PosedHost(host, kernel) for host in releases()
            for kernel in host.kernels if kernel.name and kernel.proc_version}


def kernel_params() -> list[Any]:
    """One pytest param per (release, kernel), its id the kernel's release."""
    return [pytest.param(host, kernel, id=f"{host.name}-{kernel.release}")
            for host in releases() for kernel in host.kernels]


def unsupported_params() -> list[Any]:
    """One pytest param per refused release: (id, version_id, the nearest supported)."""
    rows = json.loads((HOSTS / "unsupported.json").read_text())["releases"]
    return [pytest.param(row["id"], row["version_id"], row["nearest"],
                         id=f"{row['id']}-{row['version_id']}") for row in rows]
