/* Fake nvidia-drm.ko: needs nvidia-modeset; only its parameters matter to tests. */
#include <linux/init.h>
#include <linux/module.h>
#include <linux/moduleparam.h>

int nvfake_modeset_gpu_count(void);

static int modeset;
static int fbdev;
module_param(modeset, int, 0444);
module_param(fbdev, int, 0444);

static int __init drm_init(void)
{
	pr_info("[drm] [nvidia-drm] modeset=%d fbdev=%d, %d GPUs\n", modeset, fbdev,
		nvfake_modeset_gpu_count());
	return 0;
}

static void __exit drm_exit(void)
{
}

module_init(drm_init);
module_exit(drm_exit);

MODULE_VERSION(NV_VERSION_STRING);
MODULE_DESCRIPTION("Fake NVIDIA DRM driver for tests");
#if NV_FLAVOUR_OPEN
MODULE_LICENSE("Dual MIT/GPL");
#else
MODULE_LICENSE("NVIDIA");
#endif
