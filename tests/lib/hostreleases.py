"""The host releases the tests pose, as data (tests/lib/hosts/<id>-<version>.json, one file per
release: its os-release, its kernels with the headers package and flavour each names, its image
tag, what its kernels' /proc/version says of their gcc, files it ships), so a new release is a
new file and not a new test file. unsupported.json lists the releases refused, each with the
nearest supported release its refusal names."""

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


def _release(path: Path) -> HostRelease:
    data: dict[str, Any] = {key: value for key, value in json.loads(path.read_text()).items()
                            if not key.startswith("note")}
    return HostRelease(
        name=path.stem,
        kernels=tuple(Kernel(**kernel) for kernel in data.pop("kernels")),
        gcc_tags=tuple(data.pop("gcc_tags", ())),
        image_compilers=tuple(data.pop("image_compilers", ())),
        dnf_kernels=tuple((row["release"], row["line"]) for row in data.pop("dnf_kernels", ())),
        **data)


def releases() -> list[HostRelease]:
    return [_release(path) for path in sorted(HOSTS.glob("*.json"))
            if path.name != "unsupported.json"]


def release(name: str) -> HostRelease:
    return _release(HOSTS / f"{name}.json")


def kernel_params() -> list[Any]:
    """One pytest param per (release, kernel), its id the kernel's release."""
    return [pytest.param(host, kernel, id=f"{host.name}-{kernel.release}")
            for host in releases() for kernel in host.kernels]


def unsupported_params() -> list[Any]:
    """One pytest param per refused release: (id, version_id, the nearest supported)."""
    rows = json.loads((HOSTS / "unsupported.json").read_text())["releases"]
    return [pytest.param(row["id"], row["version_id"], row["nearest"],
                         id=f"{row['id']}-{row['version_id']}") for row in rows]
