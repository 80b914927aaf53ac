/* Libraries the kit only has to ship with the right soname; one symbol so they are real ELF objects. */
#define STUB_EXPORT __attribute__((visibility("default")))

STUB_EXPORT const char *nvfake_library_version(void)
{
	return NV_VERSION;
}
