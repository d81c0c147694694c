/*
 * STAND-IN for libcuda.so.1 (no NVIDIA GPU here): the driver API calls the doctor's CUDA
 * children make, answering as the recorded H200 did (driver 13000; cuInit 0, or 999/100 under
 * the recorded faults). Built by tests/unit/test_probe_cuda.py into a temp dir that
 * LD_LIBRARY_PATH puts first, so the real child scripts of ct200_tools/warmup.py run unchanged.
 *
 * Behaviour per GPU, from the environment the child inherits:
 *   CT200_STANDIN_GPUS   "GPU-uuid=0000:61:00.0,..."  the GPUs this "driver" has
 *   CT200_STANDIN_FAIL   "GPU-uuid=999,..."           cuInit's result when that GPU is visible
 *   CT200_STANDIN_HANG   "GPU-uuid"                   cuInit never returns for that GPU
 * CUDA_VISIBLE_DEVICES (one UUID, or one index counted over CT200_STANDIN_GPUS) picks the GPU;
 * unset, every GPU is visible (the first answers); an unknown one, or an empty value, gives
 * 100 CUDA_ERROR_NO_DEVICE, as CUDA does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char visible_bus[64];
static int visible_count = 1;

/* The value after "key=" in a "k=v,k=v" list, copied into out; 0 when absent. */
static int lookup(const char *list, const char *key, char *out, size_t n) {
    if (!list || !key || !*key) return 0;
    size_t klen = strlen(key);
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
            size_t vlen = len - klen - 1;
            if (vlen >= n) vlen = n - 1;
            memcpy(out, p + klen + 1, vlen);
            out[vlen] = 0;
            return 1;
        }
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

/* The uuid of the i-th GPU of CT200_STANDIN_GPUS. */
static int nth_uuid(const char *list, int i, char *out, size_t n) {
    const char *p = list;
    for (int k = 0; p && *p; k++) {
        const char *eq = strchr(p, '=');
        const char *end = strchr(p, ',');
        if (!eq) return 0;
        if (k == i) {
            size_t len = (size_t)(eq - p);
            if (len >= n) len = n - 1;
            memcpy(out, p, len);
            out[len] = 0;
            return 1;
        }
        p = end ? end + 1 : NULL;
    }
    return 0;
}

int cuInit(unsigned int flags) {
    (void)flags;
    const char *gpus = getenv("CT200_STANDIN_GPUS");
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    char uuid[64] = {0}, value[64];
    if (!gpus || (cvd && !*cvd)) return 100;
    if (!cvd) { /* every GPU visible: report the first */
        visible_count = 1;
        for (const char *p = strchr(gpus, ','); p; p = strchr(p + 1, ',')) visible_count++;
        if (!nth_uuid(gpus, 0, uuid, sizeof uuid)) return 100;
    } else if (strncmp(cvd, "GPU-", 4) == 0) {
        snprintf(uuid, sizeof uuid, "%s", cvd);
    } else if (!nth_uuid(gpus, atoi(cvd), uuid, sizeof uuid)) {
        return 100;
    }
    const char *hang = getenv("CT200_STANDIN_HANG");
    if (hang && strcmp(hang, uuid) == 0) {
        for (;;) pause();
    }
    if (lookup(getenv("CT200_STANDIN_FAIL"), uuid, value, sizeof value)) return atoi(value);
    if (!lookup(gpus, uuid, visible_bus, sizeof visible_bus)) return 100;
    return 0;
}

int cuDriverGetVersion(int *v) { *v = 13000; return 0; }

int cuGetErrorName(int code, const char **name) {
    switch (code) {
    case 0: *name = "CUDA_SUCCESS"; return 0;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 999: *name = "CUDA_ERROR_UNKNOWN"; return 0;
    default: return 1; /* CUDA_ERROR_INVALID_VALUE: the doctor names it from its own table */
    }
}

int cuDeviceGetCount(int *n) { *n = visible_bus[0] ? visible_count : 0; return 0; }

int cuDeviceGet(int *dev, int ordinal) {
    if (ordinal != 0 || !visible_bus[0]) return 101;
    *dev = 0;
    return 0;
}

int cuDeviceGetPCIBusId(char *out, int len, int dev) {
    (void)dev;
    /* CUDA writes upper-case hex ("0000:61:00.0" -> "0000:61:00.0" with A-F upper). */
    int i = 0;
    for (; visible_bus[i] && i < len - 1; i++) {
        char c = visible_bus[i];
        out[i] = (c >= 'a' && c <= 'f') ? (char)(c - 'a' + 'A') : c;
    }
    out[i] = 0;
    return 0;
}

int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    (void)dev;
    static int token;
    *ctx = &token;
    return 0;
}

int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
