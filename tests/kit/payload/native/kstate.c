/* Reads /proc/driver/nvidia, /dev/nvidiactl and sysfs; no state is kept between calls. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kstate.h"

/* Test-only: lets the kit's own tests present a "loaded driver" without a kernel. */
#define TEST_ROOT_ENV "NVFAKE_TEST_ROOT"

void kstate_path(char *out, size_t len, const char *host_path)
{
	const char *root = getenv(TEST_ROOT_ENV);

	snprintf(out, len, "%s%s", root ? root : "", host_path);
}

static int looks_like_version(const char *token)
{
	int dots = 0;

	if (!isdigit((unsigned char)token[0]))
		return 0;
	for (; *token; token++) {
		if (*token == '.')
			dots++;
		else if (!isdigit((unsigned char)*token))
			return 0;
	}
	return dots > 0;
}

/* Line 1 names the version between other words in both flavours; take the first x.y[.z]. */
static int parse_version_line(char *line, char *version, size_t len)
{
	char *save = NULL;
	char *token;

	for (token = strtok_r(line, " \t\n", &save); token; token = strtok_r(NULL, " \t\n", &save)) {
		if (looks_like_version(token)) {
			snprintf(version, len, "%s", token);
			return 1;
		}
	}
	return 0;
}

enum kstate_status kstate_probe_driver(char *version, size_t len)
{
	char path[512], line[512];
	FILE *fp;
	int fd, found;

	kstate_path(path, sizeof(path), "/proc/driver/nvidia/version");
	fp = fopen(path, "r");
	if (!fp)
		return KSTATE_NO_DRIVER;
	found = fgets(line, sizeof(line), fp) && parse_version_line(line, version, len);
	fclose(fp);
	if (!found)
		return KSTATE_NO_DRIVER;

	kstate_path(path, sizeof(path), "/dev/nvidiactl");
	fd = open(path, O_RDWR);
	if (fd < 0)
		return errno == EACCES ? KSTATE_NO_PERMISSION : KSTATE_NO_DRIVER;
	close(fd);
	return KSTATE_OK;
}

static void trim(char *s)
{
	size_t n = strlen(s);
	char *start = s;

	while (n > 0 && isspace((unsigned char)s[n - 1]))
		s[--n] = '\0';
	while (*start && isspace((unsigned char)*start))
		start++;
	memmove(s, start, strlen(start) + 1);
}

static unsigned int read_sysfs_hex(const char *address, const char *attribute)
{
	char host_path[256], path[512], text[32] = "";
	FILE *fp;

	snprintf(host_path, sizeof(host_path), "/sys/bus/pci/devices/%s/%s", address, attribute);
	kstate_path(path, sizeof(path), host_path);
	fp = fopen(path, "r");
	if (!fp)
		return 0;
	if (!fgets(text, sizeof(text), fp))
		text[0] = '\0';
	fclose(fp);
	return (unsigned int)strtoul(text, NULL, 16);
}

/* The information file is "Key: \t value" lines, exactly as the real module prints them. */
static int read_information(const char *dir_name, struct kstate_gpu *gpu)
{
	char host_path[320], path[1024], line[256];
	FILE *fp;

	snprintf(host_path, sizeof(host_path), "/proc/driver/nvidia/gpus/%s/information", dir_name);
	kstate_path(path, sizeof(path), host_path);
	fp = fopen(path, "r");
	if (!fp)
		return 0;
	memset(gpu, 0, sizeof(*gpu));
	snprintf(gpu->address, sizeof(gpu->address), "%.95s", dir_name);
	while (fgets(line, sizeof(line), fp)) {
		char *colon = strchr(line, ':');
		char *value;

		if (!colon)
			continue;
		*colon = '\0';
		value = colon + 1;
		trim(line);
		trim(value);
		if (strcmp(line, "Model") == 0)
			snprintf(gpu->model, sizeof(gpu->model), "%s", value);
		else if (strcmp(line, "GPU UUID") == 0)
			snprintf(gpu->uuid, sizeof(gpu->uuid), "%s", value);
		else if (strcmp(line, "Bus Location") == 0)
			snprintf(gpu->address, sizeof(gpu->address), "%s", value);
		else if (strcmp(line, "Device Minor") == 0)
			gpu->minor = (unsigned int)strtoul(value, NULL, 10);
	}
	fclose(fp);
	sscanf(gpu->address, "%x:%x:%x.%x", &gpu->domain, &gpu->bus, &gpu->device, &gpu->function);
	gpu->vendor_id = read_sysfs_hex(gpu->address, "vendor");
	gpu->device_id = read_sysfs_hex(gpu->address, "device");
	gpu->subsys_vendor_id = read_sysfs_hex(gpu->address, "subsystem_vendor");
	gpu->subsys_device_id = read_sysfs_hex(gpu->address, "subsystem_device");
	return 1;
}

static int skip_dots(const struct dirent *entry)
{
	return entry->d_name[0] != '.';
}

int kstate_list_gpus(struct kstate_gpu *gpus, int max)
{
	char path[512];
	struct dirent **entries;
	int n, i, count = 0;

	kstate_path(path, sizeof(path), "/proc/driver/nvidia/gpus");
	n = scandir(path, &entries, skip_dots, alphasort);
	if (n < 0)
		return 0;
	for (i = 0; i < n; i++) {
		if (count < max && read_information(entries[i]->d_name, &gpus[count]))
			count++;
		free(entries[i]);
	}
	free(entries);
	return count;
}

int kstate_read_gpu_state(const struct kstate_gpu *gpu, struct kstate_gpu_state *state)
{
	char host_path[320], path[1024], line[128];
	FILE *fp;

	memset(state, 0, sizeof(*state));
	snprintf(host_path, sizeof(host_path), "/proc/driver/nvidia/gpus/%s/nvfake-state",
		 gpu->address);
	kstate_path(path, sizeof(path), host_path);
	fp = fopen(path, "r");
	if (!fp)
		return -1;
	while (fgets(line, sizeof(line), fp)) {
		char hex[33];
		unsigned int number;
		int value;

		if (sscanf(line, "PersistenceMode: %d", &value) == 1)
			state->persistence = value;
		else if (sscanf(line, "FabricSupported: %d", &value) == 1)
			state->fabric_supported = value;
		else if (sscanf(line, "FabricState: %d", &value) == 1)
			state->fabric_state = value;
		else if (sscanf(line, "FabricStatus: %d", &value) == 1)
			state->fabric_status = value;
		else if (sscanf(line, "FabricCliqueId: %u", &number) == 1)
			state->clique_id = number;
		else if (sscanf(line, "FabricHealthMask: %u", &number) == 1)
			state->health_mask = number;
		else if (sscanf(line, "FabricHealthSummary: %d", &value) == 1)
			state->health_summary = value;
		else if (sscanf(line, "FabricQueryError: %d", &value) == 1)
			state->fabric_query_error = value;
		else if (sscanf(line, "FabricClusterUuid: %32[0-9a-f]", hex) == 1 &&
			 strlen(hex) == 32) {
			int i;

			for (i = 0; i < 16; i++) {
				unsigned int byte;

				sscanf(hex + 2 * i, "%2x", &byte);
				state->cluster_uuid[i] = (unsigned char)byte;
			}
		}
	}
	fclose(fp);
	return 0;
}
