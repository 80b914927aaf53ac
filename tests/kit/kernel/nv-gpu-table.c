/*
 * Which GPUs this driver version supports, in the shape of NVIDIA's support
 * rules: Kepler ended at 470, Maxwell/Pascal/Volta at 580, Hopper and Ada
 * start at 525, Blackwell at 570 and Grace Hopper (GH200) with the open
 * modules only, and the open
 * modules need Turing or newer (a GSP).
 */
#include <linux/kernel.h>
#include <linux/printk.h>

#include "nv-internal.h"

#define NV_FIRST_TURING_DEVICE 0x1e00

static const struct nv_gpu_model nv_gpu_models[] = {
	{ 0x102d, 0x102d, "Tesla K80", 0, 470, "470.xx", false },
	{ 0x13f2, 0x13f2, "Tesla M60", 0, 580, NULL, false },
	{ 0x15f8, 0x15f8, "Tesla P100-PCIE-16GB", 0, 580, NULL, false },
	{ 0x1db1, 0x1db1, "Tesla V100-SXM2-16GB", 0, 580, NULL, false },
	{ 0x1db4, 0x1db4, "Tesla V100-PCIE-16GB", 0, 580, NULL, false },
	{ 0x1db5, 0x1db5, "Tesla V100-SXM2-32GB", 0, 580, NULL, false },
	{ 0x1db6, 0x1db6, "Tesla V100-PCIE-32GB", 0, 580, NULL, false },
	{ 0x1db0, 0x1dbf, "Tesla V100", 0, 580, NULL, false },
	{ 0x1eb8, 0x1eb8, "Tesla T4", 0, 0, NULL, false },
	{ 0x20b0, 0x20b0, "NVIDIA A100-SXM4-40GB", 450, 0, NULL, false },
	{ 0x20b2, 0x20b2, "NVIDIA A100-SXM4-80GB", 450, 0, NULL, false },
	{ 0x20b5, 0x20b5, "NVIDIA A100 80GB PCIe", 450, 0, NULL, false },
	{ 0x2330, 0x2330, "NVIDIA H100 80GB HBM3", 525, 0, NULL, false },
	{ 0x2331, 0x2331, "NVIDIA H100 PCIe", 525, 0, NULL, false },
	{ 0x2339, 0x2339, "NVIDIA H100", 525, 0, NULL, false },
	{ 0x26b9, 0x26b9, "NVIDIA L40S", 525, 0, NULL, false },
	{ 0x27b8, 0x27b8, "NVIDIA L4", 525, 0, NULL, false },
	{ 0x2342, 0x2342, "NVIDIA GH200 480GB", 535, 0, NULL, true },
	{ 0x2348, 0x2348, "NVIDIA GH200 144G HBM3e", 570, 0, NULL, true },
	{ 0x2901, 0x2901, "NVIDIA B200", 570, 0, NULL, true },
	{ 0x2909, 0x2909, "NVIDIA B200", 595, 0, NULL, true },
	{ 0x2941, 0x2941, "NVIDIA GB200", 570, 0, NULL, true },
	{ 0x3182, 0x3182, "NVIDIA B300 SXM6 AC", 580, 0, NULL, true },
	{ 0x31c2, 0x31c2, "NVIDIA GB300", 580, 0, NULL, true },
	{ 0x31c3, 0x31c3, "NVIDIA GB300", 595, 0, NULL, true },
};

const struct nv_gpu_model *nv_gpu_model_lookup(u32 device)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(nv_gpu_models); i++) {
		if (device >= nv_gpu_models[i].device_first &&
		    device <= nv_gpu_models[i].device_last)
			return &nv_gpu_models[i];
	}
	return NULL;
}

/* 0 when this build drives the GPU; otherwise logs NVIDIA's reason and returns -ENODEV. */
int nv_gpu_check_supported(const struct nv_gpu *gpu)
{
	const struct nv_gpu_model *model = nv_gpu_model_lookup(gpu->device);

	if (model && model->max_major && NV_MAJOR > model->max_major) {
		if (model->legacy_branch)
			pr_err("NVRM: The NVIDIA %s GPU installed in this system is supported through the NVIDIA %s Legacy drivers. The %s NVIDIA driver will ignore this GPU.\n",
			       model->name, model->legacy_branch, NV_VERSION_STRING);
		else
			pr_err("NVRM: The NVIDIA GPU %s (PCI ID: 10de:%04x) installed in this system is no longer supported by the NVIDIA %s driver release; the last branch supporting it is %u.\n",
			       gpu->address, gpu->device, NV_VERSION_STRING, model->max_major);
		return -ENODEV;
	}
	if (model && NV_MAJOR < model->min_major) {
		pr_err("NVRM: The NVIDIA GPU %s (PCI ID: 10de:%04x) installed in this system is not supported by the NVIDIA %s driver release.\n",
		       gpu->address, gpu->device, NV_VERSION_STRING);
		return -ENODEV;
	}
	if (NV_FLAVOUR_OPEN && gpu->device < NV_FIRST_TURING_DEVICE) {
		pr_err("NVRM: The NVIDIA GPU %s (PCI ID: 10de:%04x) installed in this system is not supported by open nvidia.ko because it does not include the required GPU System Processor (GSP).\n",
		       gpu->address, gpu->device);
		return -ENODEV;
	}
	if (!NV_FLAVOUR_OPEN && model && model->open_only) {
		pr_err("NVRM: The NVIDIA GPU %s (PCI ID: 10de:%04x) installed in this system requires use of the NVIDIA open kernel modules.\n",
		       gpu->address, gpu->device);
		return -ENODEV;
	}
	return 0;
}

static u32 nv_fnv1a(const char *text, u32 seed)
{
	u32 hash = 2166136261u ^ seed;

	while (*text) {
		hash ^= (u8)*text++;
		hash *= 16777619u;
	}
	return hash;
}

/* Stable per PCI address, so tests and the fake NVML can predict it. */
void nv_gpu_uuid(const struct nv_gpu *gpu, char *out, size_t len)
{
	u32 w[4];
	int i;

	for (i = 0; i < 4; i++)
		w[i] = nv_fnv1a(gpu->address, i);
	snprintf(out, len, "GPU-%08x-%04x-%04x-%04x-%04x%08x",
		 w[0], w[1] >> 16, w[1] & 0xffff, w[2] >> 16, w[2] & 0xffff, w[3]);
}
