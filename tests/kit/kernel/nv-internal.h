/* Shared between the parts of the fake nvidia.ko. */
#ifndef NV_INTERNAL_H
#define NV_INTERNAL_H

#include <linux/types.h>

#define NV_MAX_GPUS 32
#define NV_PCI_ADDRESS_LEN 32
#define NV_MAJOR_DEVICE_NUMBER 195
#define NV_MINOR_MODESET 254
#define NV_MINOR_CONTROL 255

struct nv_gpu {
	char address[NV_PCI_ADDRESS_LEN]; /* domain:bus:dev.fn, the PCI directory name */
	u32 device;
	u32 irq;
	int minor;
};

struct nv_gpu_model {
	u32 device_first;
	u32 device_last;
	const char *name;
	unsigned int min_major;  /* 0: no lower bound */
	unsigned int max_major;  /* 0: no upper bound */
	const char *legacy_branch;  /* the branch that still supports it, once max_major passed */
	bool open_only;
};

struct nv_parm {
	const char *name;
	const unsigned int *data;
};

extern const struct nv_parm nv_parms[];
extern struct nv_gpu nv_gpus[NV_MAX_GPUS];
extern int nv_gpu_count;

int nv_pci_scan(const char *devices_dir);
const struct nv_gpu_model *nv_gpu_model_lookup(u32 device);
int nv_gpu_check_supported(const struct nv_gpu *gpu);
void nv_gpu_uuid(const struct nv_gpu *gpu, char *out, size_t len);

int nv_procfs_init(void);
void nv_procfs_exit(void);

int nv_chrdev_init(void);
void nv_chrdev_exit(void);

#endif
