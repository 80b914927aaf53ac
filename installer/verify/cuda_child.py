"""The CUDA child, `python -m installer.verify cuda`: a tiny PTX kernel on every GPU through
libcuda.so.1's driver API (ctypes, no toolkit), one JSON line. The only libcuda user."""

from __future__ import annotations

import ctypes
import json
import os
from typing import Any, Optional

from installer.verify.child import loaded_library_path

# out[i] = a * i + b, one thread per element. PTX ISA 6.0 for sm_50: every driver since CUDA 9
# JIT-compiles it for the GPU it finds (PTX is forward compatible), so one text fits all GPUs.
KERNEL = "installer_check"
PTX = b"""
.version 6.0
.target sm_50
.address_size 64

.visible .entry installer_check(
    .param .u64 out,
    .param .u32 a,
    .param .u32 b,
    .param .u32 n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;

    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [a];
    ld.param.u32 %r2, [b];
    ld.param.u32 %r3, [n];
    mov.u32 %r4, %ctaid.x;
    mov.u32 %r5, %ntid.x;
    mov.u32 %r6, %tid.x;
    mad.lo.s32 %r4, %r4, %r5, %r6;
    setp.ge.u32 %p1, %r4, %r3;
    @%p1 bra DONE;
    mad.lo.s32 %r7, %r4, %r1, %r2;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r4, 4;
    add.s64 %rd2, %rd2, %rd3;
    st.global.u32 [%rd2], %r7;
DONE:
    ret;
}
"""
ELEMENTS = 256
BLOCK = 128
A, B = 7, 3


class CudaError(Exception):
    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} returned {code}")
        self.call = call
        self.code = code


def cuda_check() -> dict[str, Any]:
    """Runs the kernel on each GPU libcuda.so.1 (as the dynamic loader finds it) enumerates.

    A failing cuInit/cuDeviceGetCount is `error`; a failing GPU has its own `error`. Every error
    is `{"call", "code", "name", "text"}` with the library's own name and text for the code.
    """
    # Bus order makes ordinals match NVML's; a caller's device mask must not hide a GPU; and
    # the JIT's cache would otherwise be written into the host's $HOME.
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_CACHE_DISABLE"] = "1"
    answer: dict[str, Any] = {"library": None, "driver_version": None, "devices": [],
                              "error": None}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        answer["error"] = {"call": "dlopen libcuda.so.1", "code": None, "name": None,
                           "text": str(exc)}
        return answer
    answer["library"] = loaded_library_path("libcuda.so")
    version = ctypes.c_int()
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
        answer["driver_version"] = version.value
    count = ctypes.c_int()
    try:
        _call(lib, "cuInit", ctypes.c_uint(0))
        _call(lib, "cuDeviceGetCount", ctypes.byref(count))
    except CudaError as exc:
        answer["error"] = _error_json(lib, exc)
        return answer
    answer["devices"] = [_device(lib, ordinal) for ordinal in range(count.value)]
    return answer


def _device(lib: ctypes.CDLL, ordinal: int) -> dict[str, Any]:
    found: dict[str, Any] = {"ordinal": ordinal, "name": None, "pci_bus_id": None,
                             "ok": False, "error": None}
    device = ctypes.c_int()
    context = ctypes.c_void_p()
    retained = False
    try:
        _call(lib, "cuDeviceGet", ctypes.byref(device), ctypes.c_int(ordinal))
        text = ctypes.create_string_buffer(256)
        _call(lib, "cuDeviceGetName", text, ctypes.c_int(len(text)), device)
        found["name"] = text.value.decode(errors="replace")
        _call(lib, "cuDeviceGetPCIBusId", text, ctypes.c_int(len(text)), device)
        found["pci_bus_id"] = text.value.decode(errors="replace")
        _call(lib, "cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        retained = True
        _call(lib, "cuCtxSetCurrent", context)
        found["ok"] = _run_kernel(lib)
        if not found["ok"]:
            found["error"] = {"call": "compare", "code": None, "name": None,
                              "text": f"the kernel's {ELEMENTS} results differ from a*i+b"}
    except CudaError as exc:
        found["error"] = _error_json(lib, exc)
    finally:
        if retained:
            lib.cuCtxSetCurrent(ctypes.c_void_p())
            lib.cuDevicePrimaryCtxRelease_v2(device)
    return found


def _run_kernel(lib: ctypes.CDLL) -> bool:
    module = ctypes.c_void_p()
    function = ctypes.c_void_p()
    memory = ctypes.c_uint64()
    size = ELEMENTS * 4
    _call(lib, "cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(PTX))
    try:
        _call(lib, "cuModuleGetFunction", ctypes.byref(function), module, KERNEL.encode())
        _call(lib, "cuMemAlloc_v2", ctypes.byref(memory), ctypes.c_size_t(size))
        try:
            a, b, n = ctypes.c_uint32(A), ctypes.c_uint32(B), ctypes.c_uint32(ELEMENTS)
            params = (ctypes.c_void_p * 4)(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
                                             for v in (memory, a, b, n)))
            blocks = (ELEMENTS + BLOCK - 1) // BLOCK
            _call(lib, "cuLaunchKernel", function, ctypes.c_uint(blocks), ctypes.c_uint(1),
                  ctypes.c_uint(1), ctypes.c_uint(BLOCK), ctypes.c_uint(1), ctypes.c_uint(1),
                  ctypes.c_uint(0), ctypes.c_void_p(), params, ctypes.c_void_p())
            _call(lib, "cuCtxSynchronize")
            result = (ctypes.c_uint32 * ELEMENTS)()
            _call(lib, "cuMemcpyDtoH_v2", result, memory, ctypes.c_size_t(size))
        finally:
            lib.cuMemFree_v2(memory)
    finally:
        lib.cuModuleUnload(module)
    return list(result) == [(A * i + B) & 0xFFFFFFFF for i in range(ELEMENTS)]


def _call(lib: ctypes.CDLL, name: str, *args: Any) -> None:
    code = getattr(lib, name)(*args)
    if code != 0:
        raise CudaError(name, int(code))


def _error_json(lib: ctypes.CDLL, exc: CudaError) -> dict[str, Any]:
    return {"call": exc.call, "code": exc.code,
            "name": _error_text(lib, "cuGetErrorName", exc.code),
            "text": _error_text(lib, "cuGetErrorString", exc.code)}


def _error_text(lib: ctypes.CDLL, call: str, code: int) -> Optional[str]:
    # Both answer CUDA_ERROR_INVALID_VALUE for a code this library has no name for.
    text = ctypes.c_char_p()
    try:
        if getattr(lib, call)(ctypes.c_int(code), ctypes.byref(text)) != 0 or text.value is None:
            return None
    except AttributeError:
        return None
    return text.value.decode(errors="replace")


def main() -> int:
    print(json.dumps(cuda_check()), flush=True)
    return 0
