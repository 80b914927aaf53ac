/* Fake nvidia-uvm.ko: a dynamic char major named nvidia-uvm, minors 0 (uvm) and 1 (uvm-tools). */
#include <linux/cdev.h>
#include <linux/fs.h>
#include <linux/init.h>
#include <linux/module.h>
#include <linux/moduleparam.h>

#define UVM_MINOR_COUNT 2

int nvfake_gpu_count(void);

static bool uvm_disable_hmm;
module_param(uvm_disable_hmm, bool, 0444);

static dev_t uvm_dev;
static struct cdev uvm_cdev;

static int uvm_open(struct inode *inode, struct file *file)
{
	return 0;
}

static const struct file_operations uvm_fops = {
	.owner = THIS_MODULE,
	.open = uvm_open,
	.llseek = noop_llseek,
};

static int __init uvm_init(void)
{
	int ret;

	ret = alloc_chrdev_region(&uvm_dev, 0, UVM_MINOR_COUNT, "nvidia-uvm");
	if (ret)
		return ret;
	cdev_init(&uvm_cdev, &uvm_fops);
	uvm_cdev.owner = THIS_MODULE;
	ret = cdev_add(&uvm_cdev, uvm_dev, UVM_MINOR_COUNT);
	if (ret) {
		unregister_chrdev_region(uvm_dev, UVM_MINOR_COUNT);
		return ret;
	}
	pr_info("nvidia-uvm: Loaded the UVM driver, major device number %d (%d GPUs).\n",
		MAJOR(uvm_dev), nvfake_gpu_count());
	return 0;
}

static void __exit uvm_exit(void)
{
	cdev_del(&uvm_cdev);
	unregister_chrdev_region(uvm_dev, UVM_MINOR_COUNT);
}

module_init(uvm_init);
module_exit(uvm_exit);

MODULE_VERSION(NV_VERSION_STRING);
MODULE_DESCRIPTION("Fake NVIDIA UVM driver for tests");
#if NV_FLAVOUR_OPEN
MODULE_LICENSE("Dual MIT/GPL");
#else
MODULE_LICENSE("NVIDIA");
#endif
