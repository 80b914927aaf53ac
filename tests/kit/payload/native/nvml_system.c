/* nvmlInit/nvmlShutdown and the system queries: answers come from the loaded kernel module. */
#include <stdio.h>
#include <string.h>

#include "nvml.h"

static int init_count;
static int gpu_count;
static struct kstate_gpu gpus[KSTATE_MAX_GPUS];
static char driver_version[64];

int nvml_is_initialized(void)
{
	return init_count > 0;
}

int nvml_gpu_count(void)
{
	return gpu_count;
}

nvmlDevice_t nvml_handle(unsigned int index)
{
	return index < (unsigned int)gpu_count ? (nvmlDevice_t)&gpus[index] : NULL;
}

const struct kstate_gpu *nvml_gpu(nvmlDevice_t device)
{
	const struct kstate_gpu *gpu = (const struct kstate_gpu *)device;

	if (!nvml_is_initialized() || gpu < gpus || gpu >= gpus + gpu_count)
		return NULL;
	return gpu;
}

NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	(void)flags;
	switch (kstate_probe_driver(driver_version, sizeof(driver_version))) {
	case KSTATE_NO_PERMISSION:
		return NVML_ERROR_NO_PERMISSION;
	case KSTATE_NO_DRIVER:
		return NVML_ERROR_DRIVER_NOT_LOADED;
	case KSTATE_OK:
		break;
	}
	/* The real library refuses a kernel module of another version (after an upgrade without reload). */
	if (strcmp(driver_version, NV_VERSION) != 0)
		return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
	gpu_count = kstate_list_gpus(gpus, KSTATE_MAX_GPUS);
	init_count++;
	return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
	return nvmlInitWithFlags(0);
}

NVML_EXPORT nvmlReturn_t nvmlInit(void)
{
	return nvmlInitWithFlags(0);
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void)
{
	if (!nvml_is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	init_count--;
	return NVML_SUCCESS;
}

NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
	switch (result) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
	case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
	case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
	case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
	default: return "Unknown Error";
	}
}

nvmlReturn_t nvml_copy_text(char *out, unsigned int length, const char *text)
{
	if (!out)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (strlen(text) + 1 > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(out, text, strlen(text) + 1);
	return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	if (!nvml_is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	return nvml_copy_text(version, length, driver_version);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
	char text[80];

	snprintf(text, sizeof(text), "%d.%s", NV_CUDA_VERSION / 1000, NV_VERSION);
	return nvml_copy_text(version, length, text);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cuda_version)
{
	if (!cuda_version)
		return NVML_ERROR_INVALID_ARGUMENT;
	*cuda_version = NV_CUDA_VERSION;
	return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cuda_version)
{
	return nvmlSystemGetCudaDriverVersion(cuda_version);
}
