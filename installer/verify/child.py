"""The NVML child, `python -m installer.verify`: asks NVML and prints one JSON line. The only
module that imports pynvml."""

from __future__ import annotations

import json
import os
from typing import Any, Optional


def nvml_query() -> dict[str, Any]:
    """Asks NVML (libnvidia-ml.so.1 as the dynamic loader finds it) about the driver.

    Runs in the child process only, so a crashing or hanging library cannot take the
    installer down. NVML errors become `{"error": {"call", "type", "message"}}`.
    """
    answer: dict[str, Any] = {"driver_version": None, "gpus": [], "library": None, "error": None}
    call = "import pynvml"
    try:
        import pynvml

        call = "nvmlInit"
        pynvml.nvmlInit()
        answer["library"] = loaded_library_path("libnvidia-ml.so")
        try:
            call = "nvmlSystemGetDriverVersion"
            answer["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
            call = "nvmlDeviceGetCount"
            count = int(pynvml.nvmlDeviceGetCount())
            answer["gpus"] = [_nvml_device(pynvml, index) for index in range(count)]
        finally:
            call = "nvmlShutdown"
            pynvml.nvmlShutdown()
    except Exception as exc:  # every NVMLError_* and a missing pynvml, reported by name
        answer["error"] = _error_json(call, exc)
    return answer


def _nvml_device(pynvml: Any, index: int) -> dict[str, Any]:
    gpu: dict[str, Any] = {
        "index": index,
        "name": None,
        "uuid": None,
        "pci_bus_id": None,
        "memory_total_mib": None,
        "error": None,
    }
    call = "nvmlDeviceGetHandleByIndex"
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        call = "nvmlDeviceGetName"
        gpu["name"] = _text(pynvml.nvmlDeviceGetName(handle))
        call = "nvmlDeviceGetUUID"
        gpu["uuid"] = _text(pynvml.nvmlDeviceGetUUID(handle))
        call = "nvmlDeviceGetPciInfo"
        gpu["pci_bus_id"] = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
        call = "nvmlDeviceGetMemoryInfo"
        gpu["memory_total_mib"] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20)
    except Exception as exc:
        gpu["error"] = _error_json(call, exc)
        return gpu
    gpu["fabric"] = _nvml_fabric(pynvml, handle)
    try:
        mode = pynvml.nvmlDeviceGetPersistenceMode(handle)
        gpu["persistence_mode"] = "enabled" if mode == pynvml.NVML_FEATURE_ENABLED else "disabled"
    except Exception:  # not supported on this GPU or platform: left unknown
        gpu["persistence_mode"] = None
    try:  # CUDA sees a GPU in MIG mode only through its instances
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        gpu["mig_mode"] = "enabled" if current == pynvml.NVML_DEVICE_MIG_ENABLE else "disabled"
    except Exception:  # no MIG on this GPU (NOT_SUPPORTED), or an NVML without the call
        gpu["mig_mode"] = None
    return gpu


# nvml.h's NVML_GPU_FABRIC_STATE_* and NVML_GPU_FABRIC_HEALTH_SUMMARY_* values.
FABRIC_STATES = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}
HEALTH_SUMMARIES = {0: "not-supported", 1: "healthy", 2: "unhealthy", 3: "limited-capacity"}
# nvmlGpuFabricInfo_v3 and _v2: the struct's size | version << 24, as nvml.h builds them.
FABRIC_INFO_V3 = 0x3000028
FABRIC_INFO_V2 = 0x2000024


def _fabric_struct(ctypes: Any, with_summary: bool) -> Any:
    """nvmlGpuFabricInfo_v3_t (v2 lacks healthSummary), declared here so that the child reads
    every field whatever pynvml release is installed (older ones only know v2)."""
    fields = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16),
              ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint32),
              ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32)]
    if with_summary:
        fields.append(("healthSummary", ctypes.c_uint8))
    return type("FabricInfo", (ctypes.Structure,), {"_fields_": fields})()


def _nvml_fabric(pynvml: Any, handle: Any) -> dict[str, Any]:
    """nvmlDeviceGetGpuFabricInfoV with the v3 struct (v2 where the driver refuses v3's
    version), else nvmlDeviceGetGpuFabricInfo where the library lacks the versioned call (the
    535 branch exports only that one). A GPU that NVML keeps no fabric state for (before
    Hopper) answers NOT_SUPPORTED: "unavailable"."""
    import ctypes

    call = "nvmlDeviceGetGpuFabricInfoV"
    try:
        versioned = getattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", None)
        try:
            if versioned is None:
                raise pynvml.NVMLError_FunctionNotFound(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            info = _fabric_struct(ctypes, True)
            info.version = FABRIC_INFO_V3
            try:
                versioned(handle, ctypes.byref(info))
            except getattr(pynvml, "NVMLError_ArgumentVersionMismatch", _Never):
                info = _fabric_struct(ctypes, False)
                info.version = FABRIC_INFO_V2
                versioned(handle, ctypes.byref(info))
        except pynvml.NVMLError_FunctionNotFound:
            call = "nvmlDeviceGetGpuFabricInfo"
            info = pynvml.c_nvmlGpuFabricInfo_t()
            pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except pynvml.NVMLError_NotSupported:
        return {"state": "unavailable", "status": None}
    except pynvml.NVMLError_FunctionNotFound as exc:  # a library older than fabric state
        return {"state": "unavailable", "status": None, "error": _error_json(call, exc)}
    except Exception as exc:
        # The GPU may well have a fabric that is not up: an error is never "no fabric".
        error = _error_json(call, exc)
        return {"state": "error", "status": error["message"], "error": error}
    status = int(info.status)
    uuid = bytes(info.clusterUuid)
    mask = getattr(info, "healthMask", None)
    summary = getattr(info, "healthSummary", None)
    return {
        "state": FABRIC_STATES.get(int(info.state) & 0xFF, f"unknown-{int(info.state)}"),
        "status": "success" if status == 0 else _nvml_error_text(pynvml, status),
        "cluster_uuid": None if not any(uuid) else str(_uuid(uuid)),
        "clique_id": int(info.cliqueId),
        "health_mask": None if mask is None else int(mask),
        "health_summary": None if summary is None else HEALTH_SUMMARIES.get(
            int(summary), f"unknown-{int(summary)}"),
        "call": call,
    }


class _Never(Exception):
    """Stands in for an NVML error class an older pynvml does not define."""


def _uuid(raw: bytes) -> Any:
    import uuid

    return uuid.UUID(bytes=raw)


def _nvml_error_text(pynvml: Any, status: int) -> str:
    try:
        return f"{_text(pynvml.nvmlErrorString(status))} ({status})"
    except Exception:
        return f"NVML error {status}"


def _error_json(call: str, exc: BaseException) -> dict[str, str]:
    try:
        message = str(exc)
    except Exception:  # NVMLError.__str__ may call into a half-loaded library
        message = repr(exc)
    return {"call": call, "type": type(exc).__name__, "message": message}


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def loaded_library_path(prefix: str) -> Optional[str]:
    """The file of the shared library named `prefix`* that this process mapped (what the
    dynamic loader found), from /proc/self/maps; None when none is mapped or maps is unreadable.
    The CUDA child asks it too."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith(prefix):
                    return path
    except OSError:
        pass
    return None


def main() -> int:
    print(json.dumps(nvml_query()), flush=True)
    return 0
