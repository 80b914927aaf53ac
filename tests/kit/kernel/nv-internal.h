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
	int persistence_holders;  /* open files that keep it initialised (nv-gpu-state.c) */
	bool persistence_legacy;  /* nvmlDeviceSetPersistenceMode */
};

#define NV_MAX_SWITCHES 16
#define NV_MINOR_NVSWITCH_CONTROL 255

/* An NVSwitch: an NVIDIA PCI function of class 0x0680 (nv-nvswitch.c). */
struct nv_switch {
	char address[NV_PCI_ADDRESS_LEN];
	u32 device;
	int minor;
	bool configured;  /* routed by the fabric manager */
};

/* nvml.h's NVML_GPU_FABRIC_STATE_* values. */
enum nv_fabric_state {
	NV_FABRIC_NOT_SUPPORTED = 0,
	NV_FABRIC_NOT_STARTED = 1,
	NV_FABRIC_IN_PROGRESS = 2,
	NV_FABRIC_COMPLETED = 3,
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
#if NV_MAJOR >= 580
extern char *NVreg_CoherentGPUMemoryMode;
#endif
extern struct nv_gpu nv_gpus[NV_MAX_GPUS];
extern int nv_gpu_count;
extern struct nv_switch nv_switches[NV_MAX_SWITCHES];
extern int nv_switch_count;
extern struct mutex nv_state_lock;

int nv_pci_scan(const char *devices_dir);
const struct nv_gpu_model *nv_gpu_model_lookup(u32 device);
int nv_gpu_check_supported(const struct nv_gpu *gpu);
void nv_gpu_uuid(const struct nv_gpu *gpu, char *out, size_t len);

int nv_procfs_init(void);
void nv_procfs_exit(void);

int nv_chrdev_init(void);
void nv_chrdev_exit(void);

struct file;
struct seq_file;
int nv_gpu_file_open(struct file *file, unsigned int minor);
void nv_gpu_file_release(struct file *file);
long nv_gpu_ioctl(struct file *file, unsigned int cmd, unsigned long arg);
int nv_check_version(unsigned long arg);
void nv_gpu_state_show(struct seq_file *m, const struct nv_gpu *gpu);

int nv_nvswitch_init(void);
void nv_nvswitch_exit(void);
enum nv_fabric_state nv_fabric_state(bool nvlink5);

#endif
