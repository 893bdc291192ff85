/*
 * A fake libcuda.so.1 for the exerciser's CUDA backend (a hardware fake): the driver API calls
 * hardware/exerciser/cuda.py binds, with device memory in host memory and the three kernels
 * carried out in C exactly as their PTX says (hardware/exerciser/ptx.py). Built by the tests with
 * the system C compiler; configured through the environment:
 *
 *   FAKE_CUDA_GPUS        "BUSID=UUID;BUSID=UUID" (bus ids as the driver API writes them)
 *   FAKE_CUDA_STUCK       "DEVICE:WORD" a stuck-at-1 bit 0 in that 32-bit word of every region
 *   FAKE_CUDA_HANG        a kernel name whose launch never returns (a wedged GPU)
 *   FAKE_CUDA_NO_PEER     any value: cuDeviceCanAccessPeer answers 0
 *   FAKE_CUDA_INIT_ERROR  a CUresult cuInit returns
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef struct { int device; } context;
typedef struct { double at; } event;

#define MAX_GPUS 16
static char bus_ids[MAX_GPUS][32];
static unsigned char uuids[MAX_GPUS][16];
static int gpu_count = -1;
static __thread context *current = 0;
static int stuck_device = -1;
static long long stuck_word = -1;

static void configure(void) {
    if (gpu_count >= 0) return;
    gpu_count = 0;
    const char *spec = getenv("FAKE_CUDA_GPUS");
    char buffer[4096];
    snprintf(buffer, sizeof buffer, "%s", spec ? spec : "");
    for (char *save = 0, *item = strtok_r(buffer, ";", &save); item && gpu_count < MAX_GPUS;
         item = strtok_r(0, ";", &save)) {
        char *eq = strchr(item, '=');
        if (!eq) continue;
        *eq = 0;
        snprintf(bus_ids[gpu_count], sizeof bus_ids[0], "%s", item);
        const char *hex = eq + 1 + 4; /* after "GPU-" */
        for (int k = 0, n = 0; hex[k] && n < 16; k++) {
            if (hex[k] == '-') continue;
            unsigned int byte;
            sscanf(hex + k, "%2x", &byte);
            uuids[gpu_count][n++] = (unsigned char)byte;
            k++;
        }
        gpu_count++;
    }
    const char *stuck = getenv("FAKE_CUDA_STUCK");
    if (stuck) sscanf(stuck, "%d:%lld", &stuck_device, &stuck_word);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    configure();
    const char *error = getenv("FAKE_CUDA_INIT_ERROR");
    return error ? atoi(error) : 0;
}

CUresult cuDriverGetVersion(int *version) { *version = 12040; return 0; }

CUresult cuGetErrorName(CUresult code, const char **name) {
    switch (code) {
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    case 218: *name = "CUDA_ERROR_INVALID_PTX"; return 0;
    case 500: *name = "CUDA_ERROR_NOT_FOUND"; return 0;
    default: return 1;
    }
}

CUresult cuDeviceGetByPCIBusId(int *device, const char *bus_id) {
    for (int i = 0; i < gpu_count; i++)
        if (strcasecmp(bus_ids[i], bus_id) == 0) { *device = i; return 0; }
    return 101;
}

CUresult cuDeviceGetUuid(char *uuid, int device) {
    if (device < 0 || device >= gpu_count) return 101;
    memcpy(uuid, uuids[device], 16);
    return 0;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, int device) {
    (void)device;
    *value = attribute == 16 ? 4 : attribute == 13 ? 1000000 : 0;
    return 0;
}

CUresult cuDeviceCanAccessPeer(int *can, int device, int peer) {
    *can = getenv("FAKE_CUDA_NO_PEER") ? 0 : device != peer;
    return 0;
}

CUresult cuCtxCreate_v2(void **ctx, unsigned int flags, int device) {
    (void)flags;
    if (device < 0 || device >= gpu_count) return 101;
    context *made = malloc(sizeof *made);
    made->device = device;
    current = made;
    *ctx = made;
    return 0;
}

CUresult cuCtxDestroy_v2(void *ctx) { free(ctx); return 0; }
CUresult cuCtxSetCurrent(void *ctx) { current = ctx; return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuCtxEnablePeerAccess(void *peer, unsigned int flags) { (void)peer; (void)flags; return 0; }

CUresult cuModuleLoadDataEx(void **module, const char *image, unsigned int count, int *options, void **values) {
    if (!strstr(image, ".version") || !strstr(image, ".entry gw_fill") || !strstr(image, ".entry gw_check")
        || !strstr(image, ".entry gw_compute")) {
        for (unsigned int i = 0; i + 1 < count; i++)
            if (options[i] == 5 && options[i + 1] == 6)
                snprintf((char *)values[i], (size_t)values[i + 1], "ptxas fatal: not the exerciser's module");
        return 218;
    }
    *module = (void *)0x1;
    return 0;
}

CUresult cuModuleGetFunction(void **function, void *module, const char *name) {
    (void)module;
    static const char *names[] = {"gw_fill", "gw_check", "gw_compute"};
    for (intptr_t i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0) { *function = (void *)(i + 1); return 0; }
    return 500;
}

CUresult cuModuleUnload(void *module) { (void)module; return 0; }

static uint32_t pattern(uint64_t i, uint32_t seed) {
    return ((uint32_t)i * 0x9E3779B1u) ^ (uint32_t)(i >> 32) ^ seed;
}

static void fill(void **p) {
    uint32_t *base = (uint32_t *)(uintptr_t)*(uint64_t *)p[0];
    uint64_t words = *(uint64_t *)p[1];
    uint32_t seed = *(uint32_t *)p[2];
    for (uint64_t i = 0; i < words; i++) {
        uint32_t value = pattern(i, seed);
        base[i] = current->device == stuck_device && (long long)i == stuck_word ? value | 1u : value;
    }
}

static void check(void **p) {
    uint32_t *base = (uint32_t *)(uintptr_t)*(uint64_t *)p[0];
    uint64_t words = *(uint64_t *)p[1];
    uint32_t seed = *(uint32_t *)p[2];
    uint64_t *result = (uint64_t *)(uintptr_t)*(uint64_t *)p[3];
    for (uint64_t i = 0; i < words; i++)
        if (base[i] != pattern(i, seed)) {
            result[0] += 1;
            if (i < result[1]) result[1] = i;
        }
}

static void compute(void **p, unsigned int threads) {
    uint32_t *out = (uint32_t *)(uintptr_t)*(uint64_t *)p[0];
    uint32_t iterations = *(uint32_t *)p[1], a = *(uint32_t *)p[2], c = *(uint32_t *)p[3];
    for (uint32_t t = 0; t < threads; t++) {
        uint32_t x = t;
        for (uint32_t k = 0; k < 8 * iterations; k++) x = a * x + c;
        *out += x;
    }
}

CUresult cuLaunchKernel(void *function, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, void *stream, void **params,
                        void **extra) {
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)stream; (void)extra;
    static const char *names[] = {"", "gw_fill", "gw_check", "gw_compute"};
    intptr_t which = (intptr_t)function;
    const char *hang = getenv("FAKE_CUDA_HANG");
    if (hang && strcmp(hang, names[which]) == 0)
        for (;;) pause();
    if (which == 1) fill(params);
    else if (which == 2) check(params);
    else if (which == 3) compute(params, gx * bx);
    else return 500;
    return 0;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) { *free_bytes = *total = (size_t)1 << 30; return 0; }

CUresult cuMemAlloc_v2(uint64_t *pointer, size_t size) {
    void *memory = malloc(size);
    if (!memory) return 2;
    *pointer = (uint64_t)(uintptr_t)memory;
    return 0;
}

CUresult cuMemFree_v2(uint64_t pointer) { free((void *)(uintptr_t)pointer); return 0; }
CUresult cuMemAllocHost_v2(void **pointer, size_t size) { *pointer = malloc(size); return *pointer ? 0 : 2; }
CUresult cuMemFreeHost(void *pointer) { free(pointer); return 0; }

CUresult cuMemsetD32_v2(uint64_t pointer, unsigned int value, size_t count) {
    uint32_t *words = (uint32_t *)(uintptr_t)pointer;
    for (size_t i = 0; i < count; i++) words[i] = value;
    return 0;
}

CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t size) {
    memcpy((void *)(uintptr_t)dst, src, size);
    return 0;
}

CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t size) {
    memcpy(dst, (void *)(uintptr_t)src, size);
    return 0;
}

CUresult cuMemcpyPeer(uint64_t dst, void *dctx, uint64_t src, void *sctx, size_t size) {
    (void)dctx; (void)sctx;
    memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, size);
    return 0;
}

CUresult cuMemcpyPeerAsync(uint64_t dst, void *dctx, uint64_t src, void *sctx, size_t size, void *stream) {
    (void)stream;
    return cuMemcpyPeer(dst, dctx, src, sctx, size);
}

CUresult cuEventCreate(void **made, unsigned int flags) {
    (void)flags;
    *made = calloc(1, sizeof(event));
    return 0;
}

CUresult cuEventRecord(void *e, void *stream) { (void)stream; ((event *)e)->at = now(); return 0; }
CUresult cuEventSynchronize(void *e) { (void)e; return 0; }

CUresult cuEventElapsedTime(float *ms, void *start, void *stop) {
    *ms = (float)((((event *)stop)->at - ((event *)start)->at) * 1000.0);
    if (*ms <= 0) *ms = 0.001f;
    return 0;
}

CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
