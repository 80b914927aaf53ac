/* Persistence mode and NVLink fabric registration, as the kit's module keeps them per GPU. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "nvfake-ioctl.h"
#include "nvml.h"

static nvmlReturn_t gpu_state(nvmlDevice_t device, const struct kstate_gpu **gpu,
			      struct kstate_gpu_state *state)
{
	if (!nvml_is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	*gpu = nvml_gpu(device);
	if (!*gpu)
		return NVML_ERROR_INVALID_ARGUMENT;
	(void)kstate_read_gpu_state(*gpu, state);
	return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
	const struct kstate_gpu *gpu;
	struct kstate_gpu_state state;
	nvmlReturn_t ret = gpu_state(device, &gpu, &state);

	if (ret)
		return ret;
	if (!mode)
		return NVML_ERROR_INVALID_ARGUMENT;
	*mode = state.persistence ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
	return NVML_SUCCESS;
}

/* The legacy persistence flag: root only, like the real call. */
NVML_EXPORT nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t mode)
{
	const struct kstate_gpu *gpu;
	struct kstate_gpu_state state;
	struct nvfake_persistence request;
	char path[512];
	nvmlReturn_t ret = gpu_state(device, &gpu, &state);
	int fd, err;

	if (ret)
		return ret;
	if (mode != NVML_FEATURE_ENABLED && mode != NVML_FEATURE_DISABLED)
		return NVML_ERROR_INVALID_ARGUMENT;
	kstate_path(path, sizeof(path), "/dev/nvidiactl");
	fd = open(path, O_RDWR);
	if (fd < 0)
		return errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_DRIVER_NOT_LOADED;
	request.minor = gpu->minor;
	request.enabled = mode == NVML_FEATURE_ENABLED;
	err = ioctl(fd, NVFAKE_IOC_SET_PERSISTENCE, &request) < 0 ? errno : 0;
	close(fd);
	if (err == EPERM || err == EACCES)
		return NVML_ERROR_NO_PERMISSION;
	return err ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
}

/* Fills the fields every version shares; NOT_SUPPORTED for a GPU without fabric state. The
 * cluster UUID and clique ID are the fabric manager's answer: zero until COMPLETED. */
static nvmlReturn_t fabric(nvmlDevice_t device, unsigned char *uuid, nvmlReturn_t *status,
			   unsigned int *clique, nvmlGpuFabricState_t *fabric_state,
			   struct kstate_gpu_state *state)
{
	const struct kstate_gpu *gpu;
	nvmlReturn_t ret = gpu_state(device, &gpu, state);

	if (ret)
		return ret;
	if (!state->fabric_supported)
		return NVML_ERROR_NOT_SUPPORTED;
	if (state->fabric_query_error)
		return (nvmlReturn_t)state->fabric_query_error;
	memset(uuid, 0, NVML_GPU_FABRIC_UUID_LEN);
	*clique = 0;
	if (state->fabric_state == NVML_GPU_FABRIC_STATE_COMPLETED) {
		memcpy(uuid, state->cluster_uuid, NVML_GPU_FABRIC_UUID_LEN);
		*clique = state->clique_id;
	}
	*status = (nvmlReturn_t)state->fabric_status;
	*fabric_state = (nvmlGpuFabricState_t)state->fabric_state;
	return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device,
						    nvmlGpuFabricInfo_t *info)
{
	struct kstate_gpu_state state;

	if (!info)
		return NVML_ERROR_INVALID_ARGUMENT;
	return fabric(device, info->clusterUuid, &info->status, &info->cliqueId, &info->state,
		      &state);
}

/* The versioned call: the caller sets .version to nvmlGpuFabricInfo_v2 or _v3 (v3 adds the
 * health summary). */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void *info)
{
	nvmlGpuFabricInfo_v2_t *v2 = info;
	nvmlGpuFabricInfo_v3_t *v3 = info;
	struct kstate_gpu_state state;
	nvmlReturn_t ret;

	if (!info)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (v2->version == nvmlGpuFabricInfo_v2) {
		ret = fabric(device, v2->clusterUuid, &v2->status, &v2->cliqueId, &v2->state,
			     &state);
		if (!ret)
			v2->healthMask = state.health_mask;
		return ret;
	}
	if (v3->version == nvmlGpuFabricInfo_v3) {
		ret = fabric(device, v3->clusterUuid, &v3->status, &v3->cliqueId, &v3->state,
			     &state);
		if (!ret) {
			v3->healthMask = state.health_mask;
			v3->healthSummary = (unsigned char)state.health_summary;
		}
		return ret;
	}
	return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
}
