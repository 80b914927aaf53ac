/* Fake nvidia-modeset.ko: needs nvidia, is needed by nvidia-drm. */
#include <linux/init.h>
#include <linux/module.h>
#include <linux/moduleparam.h>

int nvfake_gpu_count(void);

static bool hdmi_deepcolor = true;
module_param(hdmi_deepcolor, bool, 0444);

/* Used by nvidia-drm so its dependency on nvidia-modeset is a real one. */
int nvfake_modeset_gpu_count(void)
{
	return nvfake_gpu_count();
}
EXPORT_SYMBOL(nvfake_modeset_gpu_count);

static int __init modeset_init(void)
{
	pr_info("nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  %s\n",
		NV_VERSION_STRING);
	return 0;
}

static void __exit modeset_exit(void)
{
}

module_init(modeset_init);
module_exit(modeset_exit);

MODULE_VERSION(NV_VERSION_STRING);
MODULE_DESCRIPTION("Fake NVIDIA modeset driver for tests");
#if NV_FLAVOUR_OPEN
MODULE_LICENSE("Dual MIT/GPL");
#else
MODULE_LICENSE("NVIDIA");
#endif
