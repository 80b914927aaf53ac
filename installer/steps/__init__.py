"""The steps every source shares, one job per module: guards before the host changes, module
files and firmware placed, the old driver switched for the new one, the new one loaded and
verified, the install recorded and the cache pruned.
The planner, the sources and the tests name them as `steps.<name>`."""

from __future__ import annotations

from installer.steps.activation import activate_step, ld_cache_step, unload_old_step
from installer.steps.coherent import decide as coherent_memory
from installer.steps.coherent import loaded_mode as coherent_memory_mode
from installer.steps.guards import (
    driver_free_before_packages_step,
    driver_free_step,
    nouveau_step,
    secure_boot_refusal,
    secure_boot_step,
)
from installer.steps.load import device_nodes_step, load_step, remove_ready_file, verify_step
from installer.steps.placement import firmware_step, module_files_step, restore_module_files
from installer.steps.record import prune_step, record_step

__all__ = [
    "activate_step",
    "coherent_memory",
    "coherent_memory_mode",
    "device_nodes_step",
    "driver_free_before_packages_step",
    "driver_free_step",
    "firmware_step",
    "ld_cache_step",
    "ldcache",
    "load_step",
    "module_files_step",
    "nouveau_step",
    "prune_step",
    "record_step",
    "remove_ready_file",
    "restore_module_files",
    "secure_boot_refusal",
    "secure_boot_step",
    "unload_old_step",
    "verify_step",
]
