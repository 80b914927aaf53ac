/* Fake nvidia.ko: stands in for NVIDIA's driver at the hardware boundary of tests. */
#include <linux/firmware.h>
#include <linux/init.h>
#include <linux/module.h>
#include <linux/moduleparam.h>

#include "nv-internal.h"

#define NV_PCI_DEVICES_DIR "/sys/bus/pci/devices"

struct nv_gpu nv_gpus[NV_MAX_GPUS];
int nv_gpu_count;

/* NVIDIA's registry keys (nv-reg.h), as module parameters and in /proc/driver/nvidia/params. */
static unsigned int NVreg_ModifyDeviceFiles = 1;
static unsigned int NVreg_DeviceFileUID;
static unsigned int NVreg_DeviceFileGID;
static unsigned int NVreg_DeviceFileMode = 0666;
static unsigned int NVreg_RestrictProfilingToAdminUsers = 1;
static unsigned int NVreg_EnableGpuFirmware = 18;
static unsigned int NVreg_OpenRmEnableUnsupportedGpus;
module_param(NVreg_ModifyDeviceFiles, uint, 0444);
module_param(NVreg_DeviceFileUID, uint, 0444);
module_param(NVreg_DeviceFileGID, uint, 0444);
module_param(NVreg_DeviceFileMode, uint, 0444);
module_param(NVreg_RestrictProfilingToAdminUsers, uint, 0444);
module_param(NVreg_EnableGpuFirmware, uint, 0444);
module_param(NVreg_OpenRmEnableUnsupportedGpus, uint, 0444);
#if NV_MAJOR >= 580
/* Coherent driver-managed memory (CDMM) on Grace-coupled GPUs, a string key from R580 on:
 * "driver" keeps GPU memory out of the kernel's NUMA nodes (open modules' os-registry.c). */
char *NVreg_CoherentGPUMemoryMode = "";
module_param(NVreg_CoherentGPUMemoryMode, charp, 0444);
#endif

static unsigned int nv_resman_debug_level = 0xffffffff;
static unsigned int nv_rm_logon_rc = 1;

/* In NVIDIA's order (nv_parms[]); nvidia-modprobe reads the DeviceFile* lines. */
const struct nv_parm nv_parms[] = {
	{ "ResmanDebugLevel", &nv_resman_debug_level },
	{ "RmLogonRC", &nv_rm_logon_rc },
	{ "ModifyDeviceFiles", &NVreg_ModifyDeviceFiles },
	{ "DeviceFileUID", &NVreg_DeviceFileUID },
	{ "DeviceFileGID", &NVreg_DeviceFileGID },
	{ "DeviceFileMode", &NVreg_DeviceFileMode },
	{ "RmProfilingAdminOnly", &NVreg_RestrictProfilingToAdminUsers },
	{ "EnableGpuFirmware", &NVreg_EnableGpuFirmware },
	{ "OpenRmEnableUnsupportedGpus", &NVreg_OpenRmEnableUnsupportedGpus },
	{ NULL, NULL },
};

/* Used by nvidia-uvm and nvidia-modeset so depmod and modprobe see real dependencies. */
int nvfake_gpu_count(void)
{
	return nv_gpu_count;
}
EXPORT_SYMBOL(nvfake_gpu_count);

#if NV_FLAVOUR_OPEN

/* GA10x and newer (Hopper, Ada, Blackwell) boot gsp_ga10x.bin; Turing and GA100 gsp_tu10x.bin. */
#define NV_FIRST_GA10X_DEVICE 0x2200

/*
 * Like the open module, whose GSP-RM runs on the GPU: nothing starts unless the kernel's
 * firmware loader finds nvidia/<version>/gsp_*.bin (in the host's /lib/firmware).
 */
static int nv_gsp_firmware_check(const struct nv_gpu *gpu)
{
	const struct firmware *fw;
	char name[64];
	int ret;

	snprintf(name, sizeof(name), "nvidia/%s/%s", NV_VERSION_STRING,
		 gpu->device < NV_FIRST_GA10X_DEVICE ? "gsp_tu10x.bin" : "gsp_ga10x.bin");
	ret = request_firmware_direct(&fw, name, NULL);
	if (ret) {
		pr_err("NVRM: RmFetchGspRmImages: No firmware image found\n");
		pr_err("NVRM: GPU %s: RmInitAdapter failed! (firmware %s: %d)\n",
		       gpu->address, name, ret);
		return ret;
	}
	release_firmware(fw);
	return 0;
}
#else
static int nv_gsp_firmware_check(const struct nv_gpu *gpu)
{
	return 0;
}
#endif

static int __init nv_init(void)
{
	int i, ret;

	ret = nv_pci_scan(NV_PCI_DEVICES_DIR);
	if (ret) {
		pr_err("NVRM: cannot read %s: %d\n", NV_PCI_DEVICES_DIR, ret);
		return ret;
	}
	if (nv_gpu_count == 0) {
		pr_err("NVRM: No NVIDIA GPU found.\n");
		return -ENODEV;
	}
	for (i = 0; i < nv_gpu_count; i++) {
		ret = nv_gpu_check_supported(&nv_gpus[i]);
		if (ret)
			return ret;
		ret = nv_gsp_firmware_check(&nv_gpus[i]);
		if (ret)
			return ret;
	}

	ret = nv_chrdev_init();
	if (ret) {
		pr_err("NVRM: failed to register char major %d: %d\n", NV_MAJOR_DEVICE_NUMBER, ret);
		return ret;
	}
	ret = nv_procfs_init();
	if (ret) {
		nv_chrdev_exit();
		return ret;
	}
	ret = nv_nvswitch_init();
	if (ret) {
		nv_procfs_exit();
		nv_chrdev_exit();
		return ret;
	}
	pr_info("NVRM: loading NVIDIA UNIX %s Kernel Module  %s  (%d GPUs)\n",
		NV_ARCH_STRING, NV_VERSION_STRING, nv_gpu_count);
	return 0;
}

static void __exit nv_exit(void)
{
	nv_nvswitch_exit();
	nv_procfs_exit();
	nv_chrdev_exit();
}

module_init(nv_init);
module_exit(nv_exit);

MODULE_VERSION(NV_VERSION_STRING);
MODULE_DESCRIPTION("Fake NVIDIA driver for tests");
#if NV_FLAVOUR_OPEN
MODULE_LICENSE("Dual MIT/GPL");
#else
MODULE_LICENSE("NVIDIA");
#endif
