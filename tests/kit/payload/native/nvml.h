/* The slice of NVIDIA's nvml.h ABI that pynvml resolves: enum values and struct layouts match. */
#ifndef NVFAKE_NVML_H
#define NVFAKE_NVML_H

#include "kstate.h"

#define NVML_EXPORT __attribute__((visibility("default")))

typedef enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NO_PERMISSION = 4,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_DRIVER_NOT_LOADED = 9,
	NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
	NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
	NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
	NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
	char busIdLegacy[16];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pciDeviceId;     /* device id << 16 | vendor id */
	unsigned int pciSubSystemId;  /* subsystem device << 16 | subsystem vendor */
	char busId[32];
} nvmlPciInfo_t;

typedef struct {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;

typedef struct {
	unsigned int version;
	unsigned long long total;
	unsigned long long reserved;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_v2_t;

#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24U)))

typedef enum {
	NVML_FEATURE_DISABLED = 0,
	NVML_FEATURE_ENABLED = 1,
} nvmlEnableState_t;

#define NVML_GPU_FABRIC_UUID_LEN 16
#define NVML_GPU_FABRIC_STATE_NOT_SUPPORTED 0
#define NVML_GPU_FABRIC_STATE_NOT_STARTED 1
#define NVML_GPU_FABRIC_STATE_IN_PROGRESS 2
#define NVML_GPU_FABRIC_STATE_COMPLETED 3

typedef unsigned char nvmlGpuFabricState_t;

typedef struct {
	unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
	nvmlReturn_t status;
	unsigned int cliqueId;
	nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

/* The fields of nvmlGpuFabricInfo_v2_t, in order: v3 adds healthSummary after them. */
#define NVML_GPU_FABRIC_INFO_V2_FIELDS \
	unsigned int version; \
	unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN]; \
	nvmlReturn_t status; \
	unsigned int cliqueId; \
	nvmlGpuFabricState_t state; \
	unsigned int healthMask;

typedef struct {
	NVML_GPU_FABRIC_INFO_V2_FIELDS
} nvmlGpuFabricInfo_v2_t;

typedef struct {
	NVML_GPU_FABRIC_INFO_V2_FIELDS
	unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;

#define nvmlGpuFabricInfo_v2 ((unsigned int)(sizeof(nvmlGpuFabricInfo_v2_t) | (2 << 24U)))
#define nvmlGpuFabricInfo_v3 ((unsigned int)(sizeof(nvmlGpuFabricInfo_v3_t) | (3 << 24U)))

/* Shared between the API files: the GPUs captured at nvmlInit, NULL handle when out of range. */
int nvml_is_initialized(void);
int nvml_gpu_count(void);
const struct kstate_gpu *nvml_gpu(nvmlDevice_t device);
nvmlDevice_t nvml_handle(unsigned int index);
nvmlReturn_t nvml_copy_text(char *out, unsigned int length, const char *text);

#endif
