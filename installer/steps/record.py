"""After the install: its record (and GKE's .cache), then the cache pruned to what the
recorded version needs."""

from __future__ import annotations

import logging
from pathlib import Path

from installer import components, state
from installer.dirs import remove_tree
from installer.hostroot import write_atomic
from installer.plan import Context, Step

log = logging.getLogger(__name__)


def record_step(ctx: Context) -> Step:
    layout, target = ctx.layout, ctx.target

    def satisfied() -> bool:
        record = state.read_record(layout.state_file)
        return (
            record is not None
            and (record.version, record.flavour, record.kernel)
            == (target.version, target.flavour, target.kernel)
            and state.read_gke_cache(layout.gke_cache_file).get("CACHE_NVIDIA_DRIVER_VERSION")
            == target.version
        )

    def apply() -> None:
        previous = state.read_record(layout.state_file)
        kernels = sorted({target.kernel, *(previous.kernels if previous else ())})
        record = state.InstallRecord(
            version=target.version,
            flavour=target.flavour,
            kernel=target.kernel,
            source=target.source,
            install_dir=str(layout.install_host),
            gpus=target.gpu_addresses,
            kernels=tuple(kernels),
            verified_at=state.utc_now() if target.load else "",
        )
        state.write_record(layout.state_file, record)
        write_atomic(layout.gke_cache_file, state.gke_cache_text(target.kernel, target.version))

    return Step("record-install", "install record and GKE's .cache",
                satisfied, apply)


def prune_step(ctx: Context) -> Step:
    """Drivers are large (a .run ~400 MB, extracted ~1 GB): once a version is recorded, keep
    only what it needs (its user space, its .run, its modules for every kernel built) and
    drop the extracted tree and every other version."""
    layout, target = ctx.layout, ctx.target

    def keep(path: Path) -> bool:
        name = path.name
        if path.parent == layout.downloads:
            return name.startswith(f"NVIDIA-Linux-{ctx.facts.arch}-{target.version}.run") or (
                components.keeps_download(name, target.version, ctx.facts.arch))  # Fabric Manager's
        return name == target.version and path.parent != layout.cache_local / "extracted"

    def leftovers() -> list[Path]:
        found = []
        for parent in (layout.install_local / "versions", layout.cache_local / "modules",
                       layout.cache_local / "extracted", layout.downloads):
            if parent.is_dir():
                found += [p for p in sorted(parent.iterdir()) if not keep(p)]
        return found

    def satisfied() -> bool:
        return not leftovers()

    def apply() -> None:
        for path in leftovers():
            size = _tree_bytes(path)
            remove_tree(path)
            log.info("pruned %s (%.1f MB)", path, size / 1e6)

    keeping = "the version dnf installs" if target.version_pending else target.version
    return Step("prune-cache", f"keep only {keeping}: drop other versions and the "
                "extracted tree", satisfied, apply)


def _tree_bytes(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*"))
