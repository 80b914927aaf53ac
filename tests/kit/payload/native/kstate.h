/* What the loaded kernel module exposes, read the way NVIDIA's user-space libraries read it. */
#ifndef NVFAKE_KSTATE_H
#define NVFAKE_KSTATE_H

#include <stddef.h>

#define KSTATE_MAX_GPUS 32
#define KSTATE_TEXT_LEN 96

enum kstate_status {
	KSTATE_OK = 0,
	KSTATE_NO_DRIVER,      /* no /proc/driver/nvidia/version or /dev/nvidiactl unusable */
	KSTATE_NO_PERMISSION,  /* /dev/nvidiactl exists but open() gave EACCES */
};

struct kstate_gpu {
	char address[KSTATE_TEXT_LEN];  /* Bus Location, as the kernel prints it */
	char model[KSTATE_TEXT_LEN];
	char uuid[KSTATE_TEXT_LEN];
	unsigned int minor;
	unsigned int domain, bus, device, function;
	unsigned int vendor_id, device_id, subsys_vendor_id, subsys_device_id;
};

/* Host path with the test-only root prefix (NVFAKE_TEST_ROOT) applied. */
void kstate_path(char *out, size_t len, const char *host_path);

/* The loaded module's version from /proc/driver/nvidia/version, and /dev/nvidiactl usable. */
enum kstate_status kstate_probe_driver(char *version, size_t len);

/* GPUs listed under /proc/driver/nvidia/gpus, sorted by PCI address. */
int kstate_list_gpus(struct kstate_gpu *gpus, int max);

/* What the kit's module keeps per GPU (gpus/<address>/nvfake-state; the real NVML asks RM). */
struct kstate_gpu_state {
	int persistence;       /* 1: persistence mode on */
	int fabric_supported;  /* 0: NVML keeps no fabric state for this GPU */
	int fabric_state;      /* NVML_GPU_FABRIC_STATE_* */
	int fabric_status;     /* an nvmlReturn_t */
	/* Set by whoever manages the fabric (Fabric Manager, or an NVL72 rack's switch trays):
	 * all zero unless the module names a cluster (HGX H100 reports zero), so no clique. */
	unsigned char cluster_uuid[16];
	unsigned int clique_id;
	unsigned int health_mask;     /* NVML_GPU_FABRIC_HEALTH_MASK_* fields */
	int health_summary;           /* NVML_GPU_FABRIC_HEALTH_SUMMARY_* */
	/* Non-zero: the nvmlReturn_t the fabric query fails with (a GPU fallen off the bus, RM
	 * out of resources): tests pose it, the real NVML answers such errors too. */
	int fabric_query_error;
};

/* 0 when the module reported the state, -1 when it did not (absent: nothing is on). */
int kstate_read_gpu_state(const struct kstate_gpu *gpu, struct kstate_gpu_state *state);

#endif
