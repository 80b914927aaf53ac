/*
 * Finds NVIDIA GPUs by reading the PCI device directory through the VFS of the
 * loading process, not the kernel's PCI core: tests bind-mount a crafted tree
 * over /sys/bus/pci/devices and the module must see what the installer sees.
 */
#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/string.h>
#include <linux/version.h>

#include "nv-internal.h"

#define NV_MAX_PCI_ENTRIES 256
#define NV_PCI_VENDOR_NVIDIA 0x10de
#define NV_PCI_CLASS_VGA 0x0300
#define NV_PCI_CLASS_3D 0x0302
#define NV_PCI_CLASS_BRIDGE_OTHER 0x0680 /* the driver claims these as NVSwitches */

struct nv_dir_listing {
	struct dir_context ctx;
	char (*names)[NV_PCI_ADDRESS_LEN];
	int count;
};

static bool nv_collect_name(struct dir_context *ctx, const char *name, int len,
			    loff_t offset, u64 ino, unsigned int type)
{
	struct nv_dir_listing *listing = container_of(ctx, struct nv_dir_listing, ctx);

	if (name[0] == '.' || len >= NV_PCI_ADDRESS_LEN)
		return true;
	if (listing->count == NV_MAX_PCI_ENTRIES)
		return false;
	memcpy(listing->names[listing->count], name, len);
	listing->names[listing->count][len] = '\0';
	listing->count++;
	return true;
}

#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 1, 0)
static int nv_collect_name_int(struct dir_context *ctx, const char *name, int len,
			       loff_t offset, u64 ino, unsigned int type)
{
	return nv_collect_name(ctx, name, len, offset, ino, type) ? 0 : -ENOSPC;
}
#define NV_FILLDIR nv_collect_name_int
#else
#define NV_FILLDIR nv_collect_name
#endif

static int nv_list_dir(const char *dir, struct nv_dir_listing *listing)
{
	struct file *file;
	int ret;

	file = filp_open(dir, O_RDONLY | O_DIRECTORY, 0);
	if (IS_ERR(file))
		return PTR_ERR(file);
	ret = iterate_dir(file, &listing->ctx);
	filp_close(file, NULL);
	return ret;
}

static int nv_read_hex(const char *dir, const char *entry, const char *attr, u32 *value)
{
	char path[128];
	char buf[32];
	struct file *file;
	loff_t pos = 0;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/%s/%s", dir, entry, attr);
	file = filp_open(path, O_RDONLY, 0);
	if (IS_ERR(file))
		return PTR_ERR(file);
	n = kernel_read(file, buf, sizeof(buf) - 1, &pos);
	filp_close(file, NULL);
	if (n < 0)
		return n;
	buf[n] = '\0';
	return kstrtou32(strim(buf), 0, value);
}

static bool nv_is_gpu(const char *dir, const char *entry, u32 *device)
{
	u32 vendor, klass;

	if (nv_read_hex(dir, entry, "vendor", &vendor) || vendor != NV_PCI_VENDOR_NVIDIA)
		return false;
	if (nv_read_hex(dir, entry, "class", &klass))
		return false;
	if (klass >> 8 != NV_PCI_CLASS_VGA && klass >> 8 != NV_PCI_CLASS_3D)
		return false;
	return nv_read_hex(dir, entry, "device", device) == 0;
}

static int nv_compare_address(const void *a, const void *b)
{
	return strcmp(((const struct nv_gpu *)a)->address, ((const struct nv_gpu *)b)->address);
}

static bool nv_is_switch(const char *dir, const char *entry, u32 *device)
{
	u32 vendor, klass;

	if (nv_read_hex(dir, entry, "vendor", &vendor) || vendor != NV_PCI_VENDOR_NVIDIA)
		return false;
	if (nv_read_hex(dir, entry, "class", &klass) || klass >> 8 != NV_PCI_CLASS_BRIDGE_OTHER)
		return false;
	return nv_read_hex(dir, entry, "device", device) == 0;
}

static int nv_compare_switch(const void *a, const void *b)
{
	return strcmp(((const struct nv_switch *)a)->address,
		      ((const struct nv_switch *)b)->address);
}

/* Fills nv_gpus and nv_switches, each sorted by PCI address; minor N is the Nth of its kind. */
int nv_pci_scan(const char *devices_dir)
{
	struct nv_dir_listing listing = { .ctx.actor = NV_FILLDIR };
	int i, ret;

	listing.names = kcalloc(NV_MAX_PCI_ENTRIES, NV_PCI_ADDRESS_LEN, GFP_KERNEL);
	if (!listing.names)
		return -ENOMEM;
	ret = nv_list_dir(devices_dir, &listing);
	if (ret)
		goto out;

	nv_gpu_count = 0;
	for (i = 0; i < listing.count && nv_gpu_count < NV_MAX_GPUS; i++) {
		struct nv_gpu *gpu = &nv_gpus[nv_gpu_count];

		if (!nv_is_gpu(devices_dir, listing.names[i], &gpu->device))
			continue;
		strscpy(gpu->address, listing.names[i], sizeof(gpu->address));
		if (nv_read_hex(devices_dir, gpu->address, "irq", &gpu->irq))
			gpu->irq = 0;
		nv_gpu_count++;
	}
	sort(nv_gpus, nv_gpu_count, sizeof(nv_gpus[0]), nv_compare_address, NULL);
	for (i = 0; i < nv_gpu_count; i++)
		nv_gpus[i].minor = i;

	nv_switch_count = 0;
	for (i = 0; i < listing.count && nv_switch_count < NV_MAX_SWITCHES; i++) {
		struct nv_switch *nvswitch = &nv_switches[nv_switch_count];

		if (!nv_is_switch(devices_dir, listing.names[i], &nvswitch->device))
			continue;
		strscpy(nvswitch->address, listing.names[i], sizeof(nvswitch->address));
		nvswitch->configured = false;
		nv_switch_count++;
	}
	sort(nv_switches, nv_switch_count, sizeof(nv_switches[0]), nv_compare_switch, NULL);
	for (i = 0; i < nv_switch_count; i++)
		nv_switches[i].minor = i;
out:
	kfree(listing.names);
	return ret;
}
