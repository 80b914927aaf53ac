/*
 * Char major 195 like the real driver: minor N is GPU N, 254 nvidia-modeset,
 * 255 nvidiactl. No device_create: nodes come from nvidia-modprobe or mknod.
 */
#include <linux/fs.h>
#include <linux/module.h>

#include "nv-internal.h"

static int nv_open(struct inode *inode, struct file *file)
{
	unsigned int minor = iminor(inode);

	if (minor == NV_MINOR_CONTROL || minor == NV_MINOR_MODESET || minor < nv_gpu_count)
		return nv_gpu_file_open(file, minor);
	return -ENODEV;
}

static int nv_release(struct inode *inode, struct file *file)
{
	nv_gpu_file_release(file);
	return 0;
}

/* .owner makes every open file hold a module reference, so rmmod fails with EBUSY. */
static const struct file_operations nv_fops = {
	.owner = THIS_MODULE,
	.open = nv_open,
	.release = nv_release,
	.unlocked_ioctl = nv_gpu_ioctl,
	.llseek = noop_llseek,
};

int nv_chrdev_init(void)
{
	return register_chrdev(NV_MAJOR_DEVICE_NUMBER, "nvidia", &nv_fops);
}

void nv_chrdev_exit(void)
{
	unregister_chrdev(NV_MAJOR_DEVICE_NUMBER, "nvidia");
}
