/* libcuda.so.1: just enough of the driver API to tell "driver present" from "no driver". */
#include <string.h>

#include "kstate.h"

#define CUDA_EXPORT __attribute__((visibility("default")))

typedef enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
} CUresult;

static int initialized;

CUDA_EXPORT CUresult cuInit(unsigned int flags)
{
	char version[64];

	(void)flags;
	if (kstate_probe_driver(version, sizeof(version)) != KSTATE_OK)
		return CUDA_ERROR_NO_DEVICE;
	if (strcmp(version, NV_VERSION) != 0)
		return CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
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

CUDA_EXPORT CUresult cuDeviceGetCount(int *count)
{
	struct kstate_gpu gpus[KSTATE_MAX_GPUS];

	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	*count = kstate_list_gpus(gpus, KSTATE_MAX_GPUS);
	return CUDA_SUCCESS;
}
