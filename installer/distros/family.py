"""What every distro family answers: the protocol the rest of the installer asks, never testing a
family's name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Protocol

if TYPE_CHECKING:
    from installer.config import Config
    from installer.hostroot import HostRoot
    from installer.runner import Runner


class Release(Protocol):
    """What a family reads of the host's os-release (`host.Distro` is one): the family's contract,
    so that distros/ asks nothing of host/."""

    @property
    def id(self) -> str: ...
    @property
    def version_id(self) -> str: ...
    @property
    def major(self) -> int: ...
    @property
    def family(self) -> str: ...


class Facts(NamedTuple):
    """What a family's header fetch needs of the host (the caller copies it from
    `host.HostFacts`): a value of distros' own, so that distros/ asks nothing of host/."""

    distro: Release
    kernel_release: str
    arch: str


class PackageNotFound(Exception):
    """None of the host's package sources has the package; `detail` says what was tried (the
    caller names the package and what it was needed for)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class HeaderFetch(Protocol):
    """A family's header fetch (distros/apt.py, dnf.py, zypper.py): its module answers these."""

    def source_files(self, root: HostRoot) -> list[PurePosixPath]: ...

    def fetch(self, root: HostRoot, config: Config, facts: Facts, work: Path, runner: Runner,
              package: str, where: str) -> list[str]: ...


class Family(ABC):
    """One family of distributions (one package format, one package manager)."""

    # The name os-release facts carry (Distro.family) and `installer plan` prints.
    name: ClassVar[str]
    # os-release ID -> the VERSION_IDs supported, or their majors ("9" takes 9.4).
    releases: ClassVar[dict[str, tuple[str, ...]]]
    # The installer image's package tool: fetches headers (reading the host's sources) and
    # installs the kernel's compiler in the container.
    image_tool: ClassVar[str]
    # Where the host keeps its package sources, for messages.
    sources_where: ClassVar[str]
    # The installer image tags of this family and the gcc majors each carries (images/).
    image_tags: ClassVar[dict[str, tuple[int, ...]]]
    # Driver sources this family offers besides NVIDIA's .run.
    package_sources: ClassVar[tuple[str, ...]] = ()
    # os-release ID -> the name messages give it ("Oracle Linux" for `ol`).
    names: ClassVar[dict[str, str]] = {}

    def supports(self, distro_id: str, version_id: str) -> bool:
        """Whether this family supports `distro_id` at `version_id` (os-release values)."""
        accepted = self.releases.get(distro_id, ())
        return version_id in accepted or version_id.split(".", 1)[0] in accepted

    def nearest_release(self, distro_id: str, version_id: str) -> str | None:
        """The supported release of `distro_id` closest to `version_id` (the newer one on a
        tie), as messages name it; None when the ID is not this family's."""
        accepted = self.releases.get(distro_id)
        if not accepted:
            return None
        wanted = _numbers(version_id)
        best = min(accepted, key=lambda r: (_distance(_numbers(r), wanted), _negated(r)))
        return f"{self.names.get(distro_id, distro_id)} {best}"

    def image_tag(self, distro: Release) -> str:
        """The installer image tag built for `distro`'s release (its userland no older than the
        host's); a tag outside `image_tags` is one no image is built for yet."""
        return f"{distro.id}{distro.version_id}"

    def module_platform(self, distro: Release) -> str | None:
        """The dnf module platform NVIDIA's driver streams resolve against on `distro`, or None
        where its packages come without module streams (and profiles)."""
        return None

    def kernel_flavour(self, kernel: str) -> str:
        """The flavour part of a kernel release, as the headers package keeps it."""
        return kernel.split("-", 2)[2] if kernel.count("-") >= 2 else "default"

    @abstractmethod
    def headers_package(self, kernel: str) -> str:
        """The package holding the header tree of exactly `kernel`."""

    @abstractmethod
    def header_fetch(self) -> HeaderFetch:
        """The module that fetches through `image_tool` (distros/<tool>.py), imported here and
        only when asked: the warm path never loads a package tool's code."""

    def source_files(self, root: HostRoot) -> list[PurePosixPath]:
        """The host's package source files (host paths), in the package manager's order."""
        return self.header_fetch().source_files(root)

    def fetch_headers(self, root: HostRoot, config: Config, facts: Facts, work: Path,
                      runner: Runner, package: str, where: str) -> list[str]:
        """Fetch `package` (and what it needs) through the image's package tool reading the
        host's sources, unpacked under `work/root`; returns the packages fetched. Writes only
        under `work`. Raises PackageNotFound (no source has it) or HeadersFetchFailed."""
        return self.header_fetch().fetch(root, config, facts, work, runner, package, where)

    def vault(self, config: Config, distro: Release, kernel: str) -> tuple[str, str] | None:
        """An archive of older releases the header fetch also reads for `kernel`: (what it is,
        its URL), or None."""
        return None

    @abstractmethod
    def ib_modules_package(self, distro: Release, kernel: str) -> str:
        """The package holding `kernel`'s InfiniBand modules (mlx5_core, mlx5_ib, ib_umad)."""

    @abstractmethod
    def owns_compiler_package(self, package: str) -> bool:
        """Whether `package` is one of this family's versioned compiler packages."""

    @abstractmethod
    def compiler_install_argvs(self, package: str) -> list[list[str]]:
        """The image tool's commands that install compiler `package` in the container."""


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit()) or (0,)


def _distance(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return tuple(abs(x - y) for x, y in zip(a, b))


def _negated(release: str) -> tuple[int, ...]:
    return tuple(-n for n in _numbers(release))
