/* Per-GPU queries; handles point at the GPUs captured by nvmlInit. */
#include <stdio.h>
#include <string.h>

#include "nvml.h"

#define MIB (1024ULL * 1024ULL)

struct memory_size {
	unsigned int device_id;
	unsigned long long mib;
};

/* What nvidia-smi reports as total memory on these boards (no GPU to ask). */
static const struct memory_size memory_sizes[] = {
	{ 0x102d, 11441 },   /* Tesla K80 (one of its two GPUs) */
	{ 0x1db4, 16384 },   /* Tesla V100-PCIE-16GB */
	{ 0x1db6, 32768 },   /* Tesla V100-PCIE-32GB */
	{ 0x1eb8, 15360 },   /* Tesla T4 */
	{ 0x20b0, 40960 },   /* A100-SXM4-40GB */
	{ 0x20b2, 81920 },   /* A100-SXM4-80GB */
	{ 0x2330, 81559 },   /* H100 80GB HBM3 */
	{ 0x26b9, 46068 },   /* L40S */
	{ 0x27b8, 23034 },   /* L4 */
	{ 0x2901, 183359 },  /* B200 */
};

#define UNKNOWN_BOARD_MIB 16384ULL

static unsigned long long total_bytes(unsigned int device_id)
{
	size_t i;

	for (i = 0; i < sizeof(memory_sizes) / sizeof(memory_sizes[0]); i++)
		if (memory_sizes[i].device_id == device_id)
			return memory_sizes[i].mib * MIB;
	return UNKNOWN_BOARD_MIB * MIB;
}

static nvmlReturn_t lookup(nvmlDevice_t device, const struct kstate_gpu **gpu)
{
	if (!nvml_is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	*gpu = nvml_gpu(device);
	return *gpu ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

/* lookup() for a query that writes to `out`: a NULL `out` is refused only once the handle is
 * known good (an uninitialized library or a bad handle is reported first). */
static nvmlReturn_t lookup_for(nvmlDevice_t device, const void *out, const struct kstate_gpu **gpu)
{
	nvmlReturn_t ret = lookup(device, gpu);

	if (ret)
		return ret;
	return out ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (!nvml_is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = (unsigned int)nvml_gpu_count();
	return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
	return nvmlDeviceGetCount_v2(count);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (!nvml_is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!device || !nvml_handle(index))
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = nvml_handle(index);
	return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
	return nvmlDeviceGetHandleByIndex_v2(index, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
	const struct kstate_gpu *gpu;
	nvmlReturn_t ret = lookup(device, &gpu);

	return ret ? ret : nvml_copy_text(name, length, gpu->model);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	const struct kstate_gpu *gpu;
	nvmlReturn_t ret = lookup(device, &gpu);

	return ret ? ret : nvml_copy_text(uuid, length, gpu->uuid);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
	const struct kstate_gpu *gpu;
	nvmlReturn_t ret = lookup_for(device, minor, &gpu);

	if (ret)
		return ret;
	*minor = gpu->minor;
	return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	const struct kstate_gpu *gpu;
	nvmlReturn_t ret = lookup_for(device, pci, &gpu);

	if (ret)
		return ret;
	memset(pci, 0, sizeof(*pci));
	pci->domain = gpu->domain;
	pci->bus = gpu->bus;
	pci->device = gpu->device;
	pci->pciDeviceId = gpu->device_id << 16 | gpu->vendor_id;
	pci->pciSubSystemId = gpu->subsys_device_id << 16 | gpu->subsys_vendor_id;
	snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0",
		 gpu->domain & 0xffff, gpu->bus & 0xff, gpu->device & 0xff);
	snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0",
		 gpu->domain, gpu->bus & 0xff, gpu->device & 0xff);
	return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	return nvmlDeviceGetPciInfo_v3(device, pci);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	return nvmlDeviceGetPciInfo_v3(device, pci);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	const struct kstate_gpu *gpu;
	nvmlReturn_t ret = lookup_for(device, memory, &gpu);

	if (ret)
		return ret;
	if (memory->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	memory->total = total_bytes(gpu->device_id);
	memory->reserved = 0;
	memory->used = 0;
	memory->free = memory->total;
	return NVML_SUCCESS;
}

/* The first layout, answered from the versioned one (the same checks, the same figures). */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	nvmlMemory_v2_t full = { .version = nvmlMemory_v2 };
	nvmlReturn_t ret = nvmlDeviceGetMemoryInfo_v2(device, memory ? &full : NULL);

	if (ret)
		return ret;
	memory->total = full.total;
	memory->used = full.used;
	memory->free = full.free;
	return NVML_SUCCESS;
}
