"""What each NVIDIA GPU model needs: supported branches and kernel module flavours."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

from installer.host import Flavour, PciGpu

OPEN: Flavour = "open"
PROPRIETARY: Flavour = "proprietary"

# Open kernel modules need a GSP, which arrived with Turing; Turing's device ids start here.
# Ids below it that our data does not know are older GPUs, not newer ones.
FIRST_TURING_DEVICE_ID = 0x1E00


class GpuModel(NamedTuple):
    """One chip in NVIDIA's supported-gpus.json terms, plus its branch range."""

    device_id: int
    name: str
    architecture: str
    features: frozenset[str]
    min_branch: int = 0
    last_branch: int | None = None
    legacy_branch: str | None = None
    known: bool = True

    @property
    def flavours(self) -> frozenset[Flavour]:
        """Kernel module types NVIDIA's rules allow for this chip."""
        if "kernelopen" not in self.features:
            return frozenset({PROPRIETARY})
        if "gsp_proprietary_supported" in self.features:
            return frozenset({OPEN, PROPRIETARY})
        return frozenset({OPEN})

    def supports_branch(self, major: int) -> bool:
        if major < self.min_branch:
            return False
        return self.last_branch is None or major <= self.last_branch

    def branch_range(self) -> str:
        """Human words for the supported branches, e.g. 'branch 525 or newer'."""
        if self.legacy_branch and self.last_branch is not None:
            return f"only the {self.last_branch} legacy branch ({self.legacy_branch})"
        if self.last_branch is not None and self.min_branch:
            return f"branches {self.min_branch} to {self.last_branch}"
        if self.last_branch is not None:
            return f"branch {self.last_branch} or older"
        if self.min_branch:
            return f"branch {self.min_branch} or newer"
        return "any branch"


class Gpu(NamedTuple):
    """A GPU found on the host together with what is known about its model."""

    pci: PciGpu
    model: GpuModel

    @property
    def label(self) -> str:
        return f"{self.model.name} ({self.pci.address}, {self.pci.device_id:#06x})"


class GpuDatabase(NamedTuple):
    models: tuple[GpuModel, ...]

    def lookup(self, device_id: int) -> GpuModel | None:
        for model in self.models:
            if model.device_id == device_id:
                return model
        return None

    def describe(self, pci: PciGpu) -> Gpu:
        """The model for `pci`; an unknown id gets NVIDIA's rule for ids it does not list."""
        model = self.lookup(pci.device_id)
        if model is None:
            model = _unknown_model(pci.device_id)
        return Gpu(pci=pci, model=model)


def _unknown_model(device_id: int) -> GpuModel:
    if device_id >= FIRST_TURING_DEVICE_ID:
        # NVIDIA: a device id the driver does not list is newer than it: open modules.
        return GpuModel(
            device_id=device_id,
            name="unknown NVIDIA GPU",
            architecture="unknown",
            features=frozenset({"kernelopen"}),
            known=False,
        )
    # Below Turing's id range the unknown chip is older than our list (a workstation card,
    # say): no GSP, so proprietary modules, and no branch after R580.
    return GpuModel(
        device_id=device_id,
        name="unknown pre-Turing NVIDIA GPU",
        architecture="pre-turing",
        features=frozenset(),
        last_branch=580,
        known=False,
    )


@functools.lru_cache(maxsize=1)
def shipped_database() -> GpuDatabase:
    """The GPU list shipped as installer/release/data/gpus.json (parsed once per process)."""
    # Beside this module, as the package is installed (importlib.resources would load zipfile
    # and its readers for the same bytes: 5 ms of the warm path).
    data = (Path(__file__).parent / "data" / "gpus.json").read_bytes()
    return parse_database(json.loads(data))


def parse_database(document: Any) -> GpuDatabase:
    """A GpuDatabase from gpus.json content; raises ValueError when malformed."""
    if not isinstance(document, dict) or not isinstance(document.get("chips"), list):
        raise ValueError("gpus.json must hold an object with a 'chips' list")
    arches = document.get("architectures", {})
    models = []
    for chip in document["chips"]:
        arch = str(chip.get("architecture", "unknown"))
        legacy = chip.get("legacybranch")
        last = arches.get(arch, {}).get("lastbranch")
        if legacy:
            # "470.xx": the only branch that still supports the chip.
            last = int(str(legacy).split(".", 1)[0])
        models.append(
            GpuModel(
                device_id=int(str(chip["devid"]), 16),
                name=str(chip["name"]),
                architecture=arch,
                features=frozenset(str(f) for f in chip.get("features", [])),
                min_branch=int(chip.get("minbranch", 0)),
                last_branch=int(last) if last is not None else None,
                legacy_branch=str(legacy) if legacy else None,
            )
        )
    return GpuDatabase(models=tuple(models))
