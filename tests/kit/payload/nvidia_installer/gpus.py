"""Which kernel module flavour the attached GPUs need, from supported-gpus.json (NVIDIA's rules)."""

from __future__ import annotations

import json

from .errors import InstallerError

OPEN = "open"
PROPRIETARY = "proprietary"
FIRST_OPEN_DEFAULT_BRANCH = 560


def default_flavour(version: str) -> str:
    return OPEN if int(version.split(".")[0]) >= FIRST_OPEN_DEFAULT_BRANCH else PROPRIETARY


def load_chips(path: str) -> dict[int, dict[str, object]]:
    with open(path) as handle:
        chips = json.load(handle)["chips"]
    return {int(str(chip["devid"]), 16): chip for chip in chips}


def flavours_for(device_id: int, chips: dict[int, dict[str, object]]) -> set[str]:
    chip = chips.get(device_id)
    if chip is None:
        return {OPEN}  # newer than this driver's list: only the open modules can know it
    features = chip.get("features", [])
    if "kernelopen" not in features:  # type: ignore[operator]
        return {PROPRIETARY}
    if "gsp_proprietary_supported" in features:  # type: ignore[operator]
        return {OPEN, PROPRIETARY}
    return {OPEN}


def recommend(version: str, device_ids: list[int], chips: dict[int, dict[str, object]]) -> str:
    """The flavour every attached GPU accepts, preferring this branch's default."""
    possible = {OPEN, PROPRIETARY}
    for device_id in device_ids:
        possible &= flavours_for(device_id, chips)
    if not possible:
        raise InstallerError(
            "The NVIDIA GPUs in this system need different kernel module types "
            "(open and proprietary); no single kernel module type supports all "
            "of them."
        )
    preferred = default_flavour(version)
    return preferred if preferred in possible else possible.pop()


def legacy_gpus(device_ids: list[int], chips: dict[int, dict[str, object]]) -> list[str]:
    """Descriptions of GPUs that only a legacy branch supports."""
    found = []
    for device_id in device_ids:
        chip = chips.get(device_id)
        if chip and chip.get("legacybranch"):
            found.append(f"{chip['name']} (supported by the {chip['legacybranch']} legacy branch)")
    return found
