/*
 * The NVSwitch part of the driver: a dynamic char major named nvidia-nvswitch (minor N is
 * switch N, 255 the control device) and /proc/driver/nvidia-nvswitch as the real driver lays
 * it out (permissions, devices/<address>/information). The fabric manager's work is one
 * session on the control device, one configure call per switch and a final "done": the GPUs'
 * fabric state follows it, and falls back to NOT_STARTED when the session's file is closed
 * (the fabric manager exited or died).
 */
#include <linux/fs.h>
#include <linux/mutex.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "nv-internal.h"
#include "nvfake-ioctl.h"

#define NVSWITCH_PROC_ROOT "driver/nvidia-nvswitch"

struct nv_switch nv_switches[NV_MAX_SWITCHES];
int nv_switch_count;

static int nvswitch_major;
static struct file *fm_session;
static bool fabric_done;

/* NVLink5 boards (HGX B200/B300) have no NVSwitch PCI function: their fabric manager (with
 * NVLSM on the ConnectX-7 LPF port) holds the same session and routes zero switches here. */
enum nv_fabric_state nv_fabric_state(bool nvlink5)
{
	if (nv_switch_count == 0 && !nvlink5)
		return NV_FABRIC_NOT_SUPPORTED;
	if (fabric_done)
		return NV_FABRIC_COMPLETED;
	return fm_session ? NV_FABRIC_IN_PROGRESS : NV_FABRIC_NOT_STARTED;
}

static void nvswitch_reset_fabric(void)
{
	int i;

	fm_session = NULL;
	fabric_done = false;
	for (i = 0; i < nv_switch_count; i++)
		nv_switches[i].configured = false;
}

static int nvswitch_open(struct inode *inode, struct file *file)
{
	unsigned int minor = iminor(inode);

	if (minor != NV_MINOR_NVSWITCH_CONTROL && minor >= nv_switch_count)
		return -ENODEV;
	file->private_data = (void *)(unsigned long)minor;
	return 0;
}

static int nvswitch_release(struct inode *inode, struct file *file)
{
	mutex_lock(&nv_state_lock);
	if (file == fm_session) {
		pr_info("nvidia-nvswitch: the fabric manager closed its session; the fabric is not configured any more\n");
		nvswitch_reset_fabric();
	}
	mutex_unlock(&nv_state_lock);
	return 0;
}

static long nvswitch_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	unsigned int minor = (unsigned long)file->private_data;
	long ret = 0;
	int i;

	if (cmd == NVFAKE_IOC_CHECK_VERSION)
		return nv_check_version(arg);
	mutex_lock(&nv_state_lock);
	switch (cmd) {
	case NVFAKE_IOC_FM_SESSION:
		if (minor != NV_MINOR_NVSWITCH_CONTROL) {
			ret = -EINVAL;
			break;
		}
		mutex_unlock(&nv_state_lock);
		ret = nv_check_version(arg);
		mutex_lock(&nv_state_lock);
		if (ret)
			break;
		if (fm_session) {
			ret = -EBUSY;
			break;
		}
		fm_session = file;
		fabric_done = false;
		break;
	case NVFAKE_IOC_SWITCH_CONFIGURE:
		if (minor >= nv_switch_count)
			ret = -EINVAL;
		else if (!fm_session)
			ret = -EACCES;
		else
			nv_switches[minor].configured = true;
		break;
	case NVFAKE_IOC_FABRIC_DONE:
		if (file != fm_session) {
			ret = -EACCES;
			break;
		}
		for (i = 0; i < nv_switch_count; i++)
			if (!nv_switches[i].configured)
				ret = -EAGAIN;
		if (!ret)
			fabric_done = true;
		break;
	default:
		ret = -ENOTTY;
	}
	mutex_unlock(&nv_state_lock);
	return ret;
}

static const struct file_operations nvswitch_fops = {
	.owner = THIS_MODULE,
	.open = nvswitch_open,
	.release = nvswitch_release,
	.unlocked_ioctl = nvswitch_ioctl,
	.llseek = noop_llseek,
};

static int nvswitch_permissions_show(struct seq_file *m, void *v)
{
	seq_puts(m, "DeviceFileMode: 438\n");
	return 0;
}

static int nvswitch_information_show(struct seq_file *m, void *v)
{
	seq_puts(m, "BIOS Version: N/A\n");
	return 0;
}

int nv_nvswitch_init(void)
{
	struct proc_dir_entry *root, *devices, *dir;
	int ret, i;

	ret = register_chrdev(0, "nvidia-nvswitch", &nvswitch_fops);
	if (ret < 0)
		return ret;
	nvswitch_major = ret;
	root = proc_mkdir(NVSWITCH_PROC_ROOT, NULL);
	if (!root || !proc_create_single("permissions", 0444, root, nvswitch_permissions_show))
		goto fail;
	devices = proc_mkdir("devices", root);
	if (!devices)
		goto fail;
	for (i = 0; i < nv_switch_count; i++) {
		dir = proc_mkdir(nv_switches[i].address, devices);
		if (!dir || !proc_create_single("information", 0444, dir, nvswitch_information_show))
			goto fail;
	}
	if (nv_switch_count)
		pr_info("nvidia-nvswitch: Probing %d NVSwitch device(s) (char major %d)\n",
			nv_switch_count, nvswitch_major);
	return 0;
fail:
	nv_nvswitch_exit();
	return -ENOMEM;
}

void nv_nvswitch_exit(void)
{
	remove_proc_subtree(NVSWITCH_PROC_ROOT, NULL);
	if (nvswitch_major > 0)
		unregister_chrdev(nvswitch_major, "nvidia-nvswitch");
	nvswitch_major = 0;
}
