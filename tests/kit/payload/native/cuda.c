/* libcuda.so.1: the driver API calls a CUDA smoke test makes, answered from the kit's kernel
 * state. Signatures and CUresult values are those of NVIDIA's cuda.h (CUDA Driver API reference,
 * "Error Handling" and "cudaError_enum"); the names and strings cuGetErrorName/String return were
 * read from NVIDIA's real 535.261.03 libcuda. A "kernel" runs by finding its `.entry` in the PTX
 * the caller loaded and writing what that entry computes (out[i] = a * i + b); nothing the real
 * library refuses is accepted here. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kstate.h"

#define CUDA_EXPORT __attribute__((visibility("default")))

typedef enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_PTX = 218,
	CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_SYSTEM_NOT_READY = 802,
	CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
	CUDA_ERROR_UNKNOWN = 999,
} CUresult;

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct kit_context *CUcontext;
typedef struct kit_module *CUmodule;
typedef struct kit_function *CUfunction;
typedef void *CUstream;

static const struct {
	CUresult code;
	const char *name, *text;
} ERRORS[] = {
	{CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
	{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	{CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
	{CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	 "PTX JIT compiler library not found"},
	{CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	{CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
	 "an illegal memory access was encountered"},
	{CUDA_ERROR_SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
	{CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	 "system has unsupported display driver / cuda driver combination"},
	{CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

#define MAX_ALLOCATIONS 16

struct kit_context {
	CUdevice device;
	int retained;
	CUresult sticky;  /* a failed launch poisons the context, as on a GPU */
	struct {
		CUdeviceptr address;
		size_t size;
		unsigned char *bytes;
	} memory[MAX_ALLOCATIONS];
};

struct kit_module {
	struct kit_context *context;
	char *ptx;
};

struct kit_function {
	struct kit_module *module;
	char name[128];
};

static int initialized;
static int device_count;
static struct kstate_gpu gpus[KSTATE_MAX_GPUS];
static struct kit_context contexts[KSTATE_MAX_GPUS];
static __thread struct kit_context *current;
static CUdeviceptr next_address = 0x7f0000000000ULL;

/* A GPU whose NVLink fabric is not registered (Fabric Manager has not run, or its registration
 * failed) keeps CUDA from starting on the whole node: cuInit answers 802. */
static int fabric_pending(void)
{
	struct kstate_gpu_state state;
	int i;

	for (i = 0; i < device_count; i++) {
		if (kstate_read_gpu_state(&gpus[i], &state) != 0 || !state.fabric_supported)
			continue;
		/* nvml.h: 0 NOT_SUPPORTED (no fabric), 1 NOT_STARTED, 2 IN_PROGRESS, 3 COMPLETED */
		if (state.fabric_state == 1 || state.fabric_state == 2 ||
		    (state.fabric_state == 3 && state.fabric_status != 0))
			return 1;
	}
	return 0;
}

/* CUDA opens /dev/nvidia<minor> for each GPU: a GPU whose node is missing or not accessible
 * (a container given only some of them) is not enumerated. */
static int visible_gpus(void)
{
	struct kstate_gpu all[KSTATE_MAX_GPUS];
	char host_path[64], path[512];
	int i, fd, count = 0, n = kstate_list_gpus(all, KSTATE_MAX_GPUS);

	for (i = 0; i < n; i++) {
		snprintf(host_path, sizeof(host_path), "/dev/nvidia%u", all[i].minor);
		kstate_path(path, sizeof(path), host_path);
		fd = open(path, O_RDWR);
		if (fd < 0)
			continue;
		close(fd);
		gpus[count++] = all[i];
	}
	return count;
}

CUDA_EXPORT CUresult cuInit(unsigned int flags)
{
	char version[64];

	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (kstate_probe_driver(version, sizeof(version)) != KSTATE_OK)
		return CUDA_ERROR_NO_DEVICE;
	if (strcmp(version, NV_VERSION) != 0)
		return CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
	device_count = visible_gpus();
	if (device_count == 0)
		return CUDA_ERROR_NO_DEVICE;
	if (fabric_pending())
		return CUDA_ERROR_SYSTEM_NOT_READY;
	initialized = 1;
	return CUDA_SUCCESS;
}

CUDA_EXPORT CUresult cuDriverGetVersion(int *version)
{
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	*version = NV_CUDA_VERSION;
	return CUDA_SUCCESS;
}

static CUresult lookup(CUresult error, const char **out, int text)
{
	size_t i;

	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < sizeof(ERRORS) / sizeof(ERRORS[0]); i++) {
		if (ERRORS[i].code == error) {
			*out = text ? ERRORS[i].text : ERRORS[i].name;
			return CUDA_SUCCESS;
		}
	}
	*out = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUDA_EXPORT CUresult cuGetErrorName(CUresult error, const char **name)
{
	return lookup(error, name, 0);
}

CUDA_EXPORT CUresult cuGetErrorString(CUresult error, const char **text)
{
	return lookup(error, text, 1);
}

CUDA_EXPORT CUresult cuDeviceGetCount(int *count)
{
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	*count = device_count;
	return CUDA_SUCCESS;
}

static CUresult check_device(CUdevice device)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (device < 0 || device >= device_count)
		return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}

CUDA_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	CUresult ret = check_device(ordinal);

	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (ret)
		return ret;
	*device = ordinal;
	return CUDA_SUCCESS;
}

CUDA_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice device)
{
	CUresult ret = check_device(device);

	if (ret)
		return ret;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "%s", gpus[device].model);
	return CUDA_SUCCESS;
}

/* "[domain]:[bus]:[device].[function]", hexadecimal, as the reference documents it. */
CUDA_EXPORT CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice device)
{
	CUresult ret = check_device(device);
	const struct kstate_gpu *gpu;

	if (ret)
		return ret;
	if (!bus_id || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	gpu = &gpus[device];
	snprintf(bus_id, (size_t)len, "%04X:%02X:%02X.%X", gpu->domain, gpu->bus, gpu->device,
		 gpu->function);
	return CUDA_SUCCESS;
}

CUDA_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device)
{
	CUresult ret = check_device(device);

	if (ret)
		return ret;
	if (!context)
		return CUDA_ERROR_INVALID_VALUE;
	contexts[device].device = device;
	contexts[device].retained++;
	*context = &contexts[device];
	return CUDA_SUCCESS;
}

static void free_all(struct kit_context *context)
{
	int i;

	for (i = 0; i < MAX_ALLOCATIONS; i++) {
		free(context->memory[i].bytes);
		context->memory[i].bytes = NULL;
		context->memory[i].size = 0;
	}
	context->sticky = CUDA_SUCCESS;
}

CUDA_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device)
{
	CUresult ret = check_device(device);

	if (ret)
		return ret;
	if (contexts[device].retained == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (--contexts[device].retained == 0) {
		free_all(&contexts[device]);
		if (current == &contexts[device])
			current = NULL;
	}
	return CUDA_SUCCESS;
}

static int live(const struct kit_context *context)
{
	return context && context >= contexts && context < contexts + KSTATE_MAX_GPUS &&
	       context->retained > 0;
}

CUDA_EXPORT CUresult cuCtxSetCurrent(CUcontext context)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (context && !live(context))
		return CUDA_ERROR_INVALID_CONTEXT;
	current = context;
	return CUDA_SUCCESS;
}

static CUresult need_context(void)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	return live(current) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUDA_EXPORT CUresult cuCtxSynchronize(void)
{
	CUresult ret = need_context();

	return ret ? ret : current->sticky;
}

/* The driver hands PTX to libnvidia-ptxjitcompiler; without it no PTX loads. */
CUDA_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	CUresult ret = need_context();
	const char *text = image;
	void *jit;
	struct kit_module *loaded;

	if (ret)
		return ret;
	if (!module || !image)
		return CUDA_ERROR_INVALID_VALUE;
	if (strncmp(text, "\x7f" "ELF", 4) == 0)
		return CUDA_ERROR_INVALID_IMAGE;  /* a cubin: the kit has no GPU code to run */
	if (!strstr(text, ".version") || !strstr(text, ".target") || !strstr(text, ".entry"))
		return CUDA_ERROR_INVALID_PTX;
	jit = dlopen("libnvidia-ptxjitcompiler.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!jit)
		return CUDA_ERROR_JIT_COMPILER_NOT_FOUND;
	dlclose(jit);
	loaded = calloc(1, sizeof(*loaded));
	if (!loaded || !(loaded->ptx = strdup(text))) {
		free(loaded);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	loaded->context = current;
	*module = loaded;
	return CUDA_SUCCESS;
}

CUDA_EXPORT CUresult cuModuleUnload(CUmodule module)
{
	CUresult ret = need_context();

	if (ret)
		return ret;
	if (!module || module->context != current)
		return CUDA_ERROR_INVALID_HANDLE;
	free(module->ptx);
	free(module);
	return CUDA_SUCCESS;
}

/* `.entry <name>(` (or blanks before the parenthesis), as a PTX entry is declared. */
static int has_entry(const char *ptx, const char *name)
{
	const char *at = ptx;
	size_t len = strlen(name);

	while ((at = strstr(at, ".entry")) != NULL) {
		const char *p = at + 6;

		while (*p == ' ' || *p == '\t')
			p++;
		if (strncmp(p, name, len) == 0) {
			p += len;
			while (*p == ' ' || *p == '\t' || *p == '\n')
				p++;
			if (*p == '(')
				return 1;
		}
		at += 6;
	}
	return 0;
}

CUDA_EXPORT CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
	CUresult ret = need_context();
	struct kit_function *found;

	if (ret)
		return ret;
	if (!function || !name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!module || module->context != current)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!has_entry(module->ptx, name))
		return CUDA_ERROR_NOT_FOUND;
	found = calloc(1, sizeof(*found));
	if (!found)
		return CUDA_ERROR_OUT_OF_MEMORY;
	found->module = module;
	snprintf(found->name, sizeof(found->name), "%s", name);
	*function = found;  /* the real driver owns functions until the module unloads; so do we */
	return CUDA_SUCCESS;
}

CUDA_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *address, size_t size)
{
	CUresult ret = need_context();
	int i;

	if (ret)
		return ret;
	if (!address || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < MAX_ALLOCATIONS; i++) {
		if (current->memory[i].bytes)
			continue;
		current->memory[i].bytes = calloc(1, size);
		if (!current->memory[i].bytes)
			return CUDA_ERROR_OUT_OF_MEMORY;
		current->memory[i].size = size;
		current->memory[i].address = next_address;
		next_address += (size + 0xFFFFF) & ~0xFFFFFULL;
		*address = current->memory[i].address;
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_OUT_OF_MEMORY;
}

/* The allocation of the current context that holds [address, address + size). */
static unsigned char *device_bytes(CUdeviceptr address, size_t size)
{
	int i;

	for (i = 0; i < MAX_ALLOCATIONS; i++) {
		CUdeviceptr start = current->memory[i].address;

		if (current->memory[i].bytes && address >= start &&
		    address + size <= start + current->memory[i].size)
			return current->memory[i].bytes + (address - start);
	}
	return NULL;
}

CUDA_EXPORT CUresult cuMemFree_v2(CUdeviceptr address)
{
	CUresult ret = need_context();
	int i;

	if (ret)
		return ret;
	for (i = 0; i < MAX_ALLOCATIONS; i++) {
		if (current->memory[i].bytes && current->memory[i].address == address) {
			free(current->memory[i].bytes);
			current->memory[i].bytes = NULL;
			current->memory[i].size = 0;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_VALUE;
}

CUDA_EXPORT CUresult cuMemcpyDtoH_v2(void *host, CUdeviceptr address, size_t size)
{
	CUresult ret = need_context();
	unsigned char *bytes;

	if (ret)
		return ret;
	if (current->sticky)
		return current->sticky;
	bytes = device_bytes(address, size);
	if (!host || !bytes)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(host, bytes, size);
	return CUDA_SUCCESS;
}

/* Runs the entry as its PTX declares it: (.u64 out, .u32 a, .u32 b, .u32 n), one thread per
 * element. A write outside the allocation is an illegal address, reported when the caller
 * synchronises, as a GPU fault is. */
CUDA_EXPORT CUresult cuLaunchKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y,
				    unsigned int grid_z, unsigned int block_x,
				    unsigned int block_y, unsigned int block_z,
				    unsigned int shared_bytes, CUstream stream, void **params,
				    void **extra)
{
	CUresult ret = need_context();
	CUdeviceptr out;
	uint32_t a, b, n, i, threads;
	unsigned char *bytes;

	(void)shared_bytes;
	if (ret)
		return ret;
	if (current->sticky)
		return current->sticky;
	if (!function || function->module->context != current || stream)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!grid_x || !grid_y || !grid_z || !block_x || !block_y || !block_z ||
	    block_x * block_y * block_z > 1024 || (params && extra) || !params)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&out, params[0], sizeof(out));
	memcpy(&a, params[1], sizeof(a));
	memcpy(&b, params[2], sizeof(b));
	memcpy(&n, params[3], sizeof(n));
	threads = grid_x * block_x;
	if (n > threads)
		n = threads;
	bytes = device_bytes(out, (size_t)n * sizeof(uint32_t));
	if (n && !bytes) {
		current->sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
		return CUDA_SUCCESS;
	}
	for (i = 0; i < n; i++) {
		uint32_t value = a * i + b;

		memcpy(bytes + (size_t)i * sizeof(value), &value, sizeof(value));
	}
	return CUDA_SUCCESS;
}
