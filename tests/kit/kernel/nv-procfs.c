/* /proc/driver/nvidia: version and gpus/<address>/information, in the real driver's format. */
#include <linux/proc_fs.h>
#include <linux/seq_file.h>

#include "nv-internal.h"

#define NV_PROC_ROOT "driver/nvidia"

static int nv_version_show(struct seq_file *m, void *v)
{
#if NV_FLAVOUR_OPEN
	seq_printf(m, "NVRM version: NVIDIA UNIX Open Kernel Module for %s  %s  Release Build  (%s)  %s\n",
		   NV_ARCH_STRING, NV_VERSION_STRING, NV_BUILD_HOST, NV_BUILD_DATE);
#else
	seq_printf(m, "NVRM version: NVIDIA UNIX %s Kernel Module  %s  %s\n",
		   NV_ARCH_STRING, NV_VERSION_STRING, NV_BUILD_DATE);
#endif
	seq_printf(m, "GCC version:  %s\n", NV_CC_VERSION);
	return 0;
}

static int nv_information_show(struct seq_file *m, void *v)
{
	const struct nv_gpu *gpu = m->private;
	const struct nv_gpu_model *model = nv_gpu_model_lookup(gpu->device);
	char uuid[48];

	nv_gpu_uuid(gpu, uuid, sizeof(uuid));
	seq_printf(m, "Model: \t\t %s\n", model ? model->name : "NVIDIA Graphics Device");
	seq_printf(m, "IRQ:   \t\t %u\n", gpu->irq);
	seq_printf(m, "GPU UUID: \t %s\n", uuid);
	seq_puts(m, "Video BIOS: \t ??.??.??.??.??\n");
	seq_puts(m, "Bus Type: \t PCIe\n");
	seq_puts(m, "DMA Size: \t 47 bits\n");
	seq_puts(m, "DMA Mask: \t 0x7fffffffffff\n");
	seq_printf(m, "Bus Location: \t %s\n", gpu->address);
	seq_printf(m, "Device Minor: \t %d\n", gpu->minor);
	seq_puts(m, "GPU Excluded:\t No\n");
	return 0;
}

/* The kit's simulated RM state, for the kit's libnvidia-ml only (nv-gpu-state.c). */
static int nv_state_show(struct seq_file *m, void *v)
{
	nv_gpu_state_show(m, m->private);
	return 0;
}

/* NVIDIA's nv_procfs_read_params(): `Name: %u` per registry key, then the string keys. */
static int nv_params_show(struct seq_file *m, void *v)
{
	const struct nv_parm *entry;

	for (entry = nv_parms; entry->name; entry++)
		seq_printf(m, "%s: %u\n", entry->name, *entry->data);
	seq_puts(m, "RegistryDwords: \"\"\n");
	seq_puts(m, "RegistryDwordsPerDevice: \"\"\n");
	seq_puts(m, "RmMsg: \"\"\n");
	seq_puts(m, "GpuBlacklist: \"\"\n");
	seq_puts(m, "TemporaryFilePath: \"\"\n");
	seq_puts(m, "ExcludedGpus: \"\"\n");
#if NV_MAJOR >= 580
	seq_printf(m, "CoherentGPUMemoryMode: \"%s\"\n", NVreg_CoherentGPUMemoryMode);
#endif
	return 0;
}

int nv_procfs_init(void)
{
	struct proc_dir_entry *root, *gpus, *gpu_dir;
	int i;

	root = proc_mkdir(NV_PROC_ROOT, NULL);
	if (!root)
		return -ENOMEM;
	if (!proc_create_single_data("version", 0444, root, nv_version_show, NULL))
		goto fail;
	if (!proc_create_single_data("params", 0444, root, nv_params_show, NULL))
		goto fail;
	gpus = proc_mkdir("gpus", root);
	if (!gpus)
		goto fail;
	for (i = 0; i < nv_gpu_count; i++) {
		gpu_dir = proc_mkdir(nv_gpus[i].address, gpus);
		if (!gpu_dir || !proc_create_single_data("information", 0444, gpu_dir,
							 nv_information_show, &nv_gpus[i]))
			goto fail;
		if (!proc_create_single_data("nvfake-state", 0444, gpu_dir, nv_state_show,
					     &nv_gpus[i]))
			goto fail;
	}
	return 0;
fail:
	nv_procfs_exit();
	return -ENOMEM;
}

void nv_procfs_exit(void)
{
	remove_proc_subtree(NV_PROC_ROOT, NULL);
}
