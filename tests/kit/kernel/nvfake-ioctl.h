/*
 * The kit's stand-in for the RM and NVSwitch control calls that NVIDIA's closed user space
 * makes (its real ioctls are not public): shared by the fake nvidia.ko, the kit's
 * libnvidia-ml and its stand-in nvidia-persistenced and nv-fabricmanager.
 */
#ifndef NVFAKE_IOCTL_H
#define NVFAKE_IOCTL_H

#ifdef __KERNEL__
#include <linux/ioctl.h>
#include <linux/types.h>
#else
#include <linux/ioctl.h>
#include <linux/types.h>
#endif

#define NVFAKE_IOC_MAGIC 0xf7
#define NVFAKE_VERSION_LEN 64

struct nvfake_version {
	char version[NVFAKE_VERSION_LEN];
};

struct nvfake_persistence {
	__u32 minor;
	__u32 enabled;
};

/* Any NVIDIA or NVSwitch device file: the driver refuses user space of another version. */
#define NVFAKE_IOC_CHECK_VERSION _IOW(NVFAKE_IOC_MAGIC, 1, struct nvfake_version)
/* /dev/nvidiaN: this open file keeps the GPU initialised (libnvidia-cfg for persistenced). */
#define NVFAKE_IOC_HOLD_PERSISTENCE _IO(NVFAKE_IOC_MAGIC, 2)
/* /dev/nvidiactl, CAP_SYS_ADMIN: the legacy per-GPU persistence flag. */
#define NVFAKE_IOC_SET_PERSISTENCE _IOW(NVFAKE_IOC_MAGIC, 3, struct nvfake_persistence)
/* /dev/nvidia-nvswitchctl: this open file becomes the fabric manager (one at a time). */
#define NVFAKE_IOC_FM_SESSION _IOW(NVFAKE_IOC_MAGIC, 4, struct nvfake_version)
/* /dev/nvidia-nvswitchN, while a fabric manager session exists: route this switch. */
#define NVFAKE_IOC_SWITCH_CONFIGURE _IO(NVFAKE_IOC_MAGIC, 5)
/* The session's file: every switch routed, the GPUs' fabric registration completes. */
#define NVFAKE_IOC_FABRIC_DONE _IO(NVFAKE_IOC_MAGIC, 6)

#endif
