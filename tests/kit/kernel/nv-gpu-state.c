/*
 * What RM keeps per GPU that the kit's user space asks about: persistence mode (held by
 * nvidia-persistenced's open device file, or the legacy flag) and the NVLink fabric state.
 * Read by the kit's libnvidia-ml from gpus/<address>/nvfake-state; changed through the ioctls
 * of nvfake-ioctl.h. Nothing here is NVIDIA's interface.
 */
#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "nv-internal.h"
#include "nvfake-ioctl.h"

DEFINE_MUTEX(nv_state_lock);

struct nv_gpu_file {
	unsigned int minor;
	bool holds_persistence;
};

int nv_gpu_file_open(struct file *file, unsigned int minor)
{
	struct nv_gpu_file *state = kzalloc(sizeof(*state), GFP_KERNEL);

	if (!state)
		return -ENOMEM;
	state->minor = minor;
	file->private_data = state;
	return 0;
}

void nv_gpu_file_release(struct file *file)
{
	struct nv_gpu_file *state = file->private_data;

	if (!state)
		return;
	mutex_lock(&nv_state_lock);
	if (state->holds_persistence && state->minor < nv_gpu_count)
		nv_gpus[state->minor].persistence_holders--;
	mutex_unlock(&nv_state_lock);
	kfree(state);
	file->private_data = NULL;
}

/* Like RM's version check of its clients: user space of another version is refused. */
int nv_check_version(unsigned long arg)
{
	struct nvfake_version request;

	if (copy_from_user(&request, (void __user *)arg, sizeof(request)))
		return -EFAULT;
	request.version[NVFAKE_VERSION_LEN - 1] = '\0';
	if (strcmp(request.version, NV_VERSION_STRING) != 0) {
		pr_err("NVRM: API mismatch: the client has the version %s, but this kernel module has the version %s.\n",
		       request.version, NV_VERSION_STRING);
		return -EINVAL;
	}
	return 0;
}

long nv_gpu_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct nv_gpu_file *state = file->private_data;
	struct nvfake_persistence request;
	long ret = 0;

	switch (cmd) {
	case NVFAKE_IOC_CHECK_VERSION:
		return nv_check_version(arg);
	case NVFAKE_IOC_HOLD_PERSISTENCE:
		if (!state || state->minor >= nv_gpu_count)
			return -EINVAL;
		mutex_lock(&nv_state_lock);
		if (!state->holds_persistence) {
			state->holds_persistence = true;
			nv_gpus[state->minor].persistence_holders++;
		}
		mutex_unlock(&nv_state_lock);
		return 0;
	case NVFAKE_IOC_SET_PERSISTENCE:
		if (!state || state->minor != NV_MINOR_CONTROL)
			return -EINVAL;
		if (!capable(CAP_SYS_ADMIN))
			return -EPERM;
		if (copy_from_user(&request, (void __user *)arg, sizeof(request)))
			return -EFAULT;
		mutex_lock(&nv_state_lock);
		if (request.minor < nv_gpu_count)
			nv_gpus[request.minor].persistence_legacy = request.enabled != 0;
		else
			ret = -EINVAL;
		mutex_unlock(&nv_state_lock);
		return ret;
	default:
		return -ENOTTY;
	}
}

/* Hopper and Blackwell (B200/GB200 0x29xx, B300/GB300 0x31xx) register with an NVLink
 * fabric; NVML has no fabric state before. */
static bool nv_gpu_fabric_capable(const struct nv_gpu *gpu)
{
	u32 family = gpu->device & 0xff00;

	return family == 0x2300 || family == 0x2900 || family == 0x3100;
}

/* HGX B200/B300: NVLink5 switches behind ConnectX-7 ports, managed from this node. */
static bool nv_gpu_nvlink5(const struct nv_gpu *gpu)
{
	return gpu->device == 0x2901 || gpu->device == 0x2909 || gpu->device == 0x3182;
}

/* GB200/GB300 NVL72 compute trays: the rack's switch trays (NVLSM, Fabric Manager, NMX-C)
 * bring the fabric up, never this node. */
static bool nv_gpu_rack_fabric(const struct nv_gpu *gpu)
{
	return gpu->device == 0x2941 || gpu->device == 0x31c2 || gpu->device == 0x31c3;
}

/*
 * What the rack's switch trays left for a tray's GPUs, set by the test under
 * /sys/module/nvidia/parameters (the rack is as absent as the GPU): the state and status, and
 * the cluster UUID (32 hex digits) and clique ID reported once the state is COMPLETED.
 */
static uint nvfake_rack_fabric_state = NV_FABRIC_NOT_STARTED;
static uint nvfake_rack_fabric_status;
static char *nvfake_rack_cluster_uuid = "";
static uint nvfake_rack_clique_id;
module_param(nvfake_rack_fabric_state, uint, 0644);
module_param(nvfake_rack_fabric_status, uint, 0644);
module_param(nvfake_rack_cluster_uuid, charp, 0644);
module_param(nvfake_rack_clique_id, uint, 0644);

void nv_gpu_state_show(struct seq_file *m, const struct nv_gpu *gpu)
{
	bool capable = nv_gpu_fabric_capable(gpu);
	bool rack = capable && nv_gpu_rack_fabric(gpu);
	int state;

	mutex_lock(&nv_state_lock);
	state = capable ? nv_fabric_state(nv_gpu_nvlink5(gpu)) : NV_FABRIC_NOT_SUPPORTED;
	seq_printf(m, "PersistenceMode: %d\n",
		   gpu->persistence_legacy || gpu->persistence_holders > 0);
	seq_printf(m, "FabricSupported: %d\n", capable);
	if (rack) {
		seq_printf(m, "FabricState: %u\n", nvfake_rack_fabric_state);
		seq_printf(m, "FabricStatus: %u\n", nvfake_rack_fabric_status);
		/* A charp parameter keeps the newline `echo` wrote. */
		if (strcspn(nvfake_rack_cluster_uuid, "\n") == 32)
			seq_printf(m, "FabricClusterUuid: %.32s\n", nvfake_rack_cluster_uuid);
		seq_printf(m, "FabricCliqueId: %u\n", nvfake_rack_clique_id);
	} else {
		seq_printf(m, "FabricState: %d\n", state);
		seq_puts(m, "FabricStatus: 0\n");
	}
	mutex_unlock(&nv_state_lock);
}
