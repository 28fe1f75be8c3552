#include "common/cudrv.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cudrv_uuid_format(const uint8_t uuid[CUDRV_UUID_BYTES], char out[CUDRV_UUID_STR_LEN])
{
    static const char hex[] = "0123456789abcdef";
    char *p = out;
    memcpy(p, "GPU-", 4);
    p += 4;
    for (int i = 0; i < CUDRV_UUID_BYTES; i++) {
        /* 8-4-4-4-12 grouping, as nvidia-smi and CUDA_VISIBLE_DEVICES write it. */
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *p++ = '-';
        *p++ = hex[uuid[i] >> 4];
        *p++ = hex[uuid[i] & 15];
    }
    *p = '\0';
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

td_err cudrv_uuid_parse(const char *s, uint8_t uuid[CUDRV_UUID_BYTES])
{
    TD_ASSERT(s && uuid);
    const char *p = s;
    if (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0)
        p += 4;
    int n = 0; /* hex digits consumed */
    for (; *p; p++) {
        if (*p == '-')
            continue;
        int v = hex_value(*p);
        if (v < 0 || n >= 2 * CUDRV_UUID_BYTES)
            return err_set(TD_EINVAL, "bad GPU UUID \"%s\": expected 32 hex digits", s);
        if (n % 2 == 0)
            uuid[n / 2] = (uint8_t)(v << 4);
        else
            uuid[n / 2] |= (uint8_t)v;
        n++;
    }
    if (n != 2 * CUDRV_UUID_BYTES)
        return err_set(TD_EINVAL, "bad GPU UUID \"%s\": expected 32 hex digits, got %d", s, n);
    return TD_OK;
}

#ifndef TANDEM_HAVE_CUDA

td_err cudrv_load(void)
{
    return err_set(TD_ENOTSUP, "this build of tandem has no CUDA support");
}

bool cudrv_available(void)
{
    return false;
}

td_err cudrv_device_count(int *count)
{
    *count = 0;
    return cudrv_load();
}

td_err cudrv_device_open(cudrv_device *dev, const char *id)
{
    (void)id;
    memset(dev, 0, sizeof *dev);
    return cudrv_load();
}

td_err cudrv_device_open_ordinal(cudrv_device *dev, int ordinal)
{
    (void)ordinal;
    memset(dev, 0, sizeof *dev);
    return cudrv_load();
}

td_err cudrv_device_open_uuid(cudrv_device *dev, const uint8_t uuid[CUDRV_UUID_BYTES])
{
    (void)uuid;
    memset(dev, 0, sizeof *dev);
    return cudrv_load();
}

void cudrv_device_close(cudrv_device *dev)
{
    (void)dev;
}

td_err cudrv_mem_info(const cudrv_device *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    (void)dev;
    *free_bytes = *total_bytes = 0;
    return cudrv_load();
}

td_err cudrv_device_bind(const cudrv_device *dev)
{
    (void)dev;
    return cudrv_load();
}

td_err cudrv_ctx_lean(const cudrv_device *dev)
{
    (void)dev;
    return cudrv_load();
}

#else /* TANDEM_HAVE_CUDA */

#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>

/* Where each entry point lives: the base name cuGetProcAddress wants with the CUDA version
 * whose ABI cudrv_api declares (cudaTypedefs.h's PFN_<base>_v<version>), and the exported
 * symbol of that ABI for drivers that predate cuGetProcAddress_v2 (CUDA < 12.0). Asking for
 * the header's CUDA_VERSION instead would be wrong: CUDA 13 gave cuCtxSynchronize a context
 * argument under the same base name. */
typedef struct cudrv_sym {
    const char *base;     /* e.g. "cuMemcpyHtoD" */
    const char *exported; /* e.g. "cuMemcpyHtoD_v2" */
    size_t offset;        /* bytes: field in cudrv_api */
    int version;          /* 1000 * major + 10 * minor: the ABI we call */
} cudrv_sym;

#define CUDRV_SYMS(X)                                                                          \
    X(cuInit, cuInit, 2000)                                                                    \
    X(cuDriverGetVersion, cuDriverGetVersion, 2020)                                            \
    X(cuGetErrorName, cuGetErrorName, 6000)                                                    \
    X(cuGetErrorString, cuGetErrorString, 6000)                                                \
    X(cuDeviceGetCount, cuDeviceGetCount, 2000)                                                \
    X(cuDeviceGet, cuDeviceGet, 2000)                                                          \
    X(cuDeviceGetUuid, cuDeviceGetUuid_v2, 11040)                                              \
    X(cuDeviceGetName, cuDeviceGetName, 2000)                                                  \
    X(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000)                                        \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000)                                \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, 11000)                          \
    X(cuCtxSetCurrent, cuCtxSetCurrent, 4000)                                                  \
    X(cuCtxSynchronize, cuCtxSynchronize, 2000)                                                \
    X(cuCtxSetLimit, cuCtxSetLimit, 3010)                                                      \
    X(cuMemGetInfo, cuMemGetInfo_v2, 3020)                                                     \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020)                     \
    X(cuMemCreate, cuMemCreate, 10020)                                                         \
    X(cuMemRelease, cuMemRelease, 10020)                                                       \
    X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020)                       \
    X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020)                   \
    X(cuMemAddressReserve, cuMemAddressReserve, 10020)                                         \
    X(cuMemAddressFree, cuMemAddressFree, 10020)                                               \
    X(cuMemMap, cuMemMap, 10020)                                                               \
    X(cuMemUnmap, cuMemUnmap, 10020)                                                           \
    X(cuMemSetAccess, cuMemSetAccess, 10020)                                                   \
    X(cuMemcpyHtoD, cuMemcpyHtoD_v2, 3020)                                                     \
    X(cuMemcpyDtoH, cuMemcpyDtoH_v2, 3020)                                                     \
    X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, 3020)                                           \
    X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, 3020)                                           \
    X(cuMemsetD8, cuMemsetD8_v2, 3020)                                                         \
    X(cuMemsetD8Async, cuMemsetD8Async, 3020)                                                  \
    X(cuStreamCreate, cuStreamCreate, 2000)                                                    \
    X(cuStreamDestroy, cuStreamDestroy_v2, 4000)                                               \
    X(cuStreamSynchronize, cuStreamSynchronize, 2000)                                          \
    X(cuStreamWaitEvent, cuStreamWaitEvent, 3020)                                              \
    X(cuEventCreate, cuEventCreate, 2000)                                                      \
    X(cuEventRecord, cuEventRecord, 2000)                                                      \
    X(cuEventSynchronize, cuEventSynchronize, 2000)                                            \
    X(cuEventDestroy, cuEventDestroy_v2, 4000)                                                 \
    X(cuIpcGetEventHandle, cuIpcGetEventHandle, 4010)                                          \
    X(cuIpcOpenEventHandle, cuIpcOpenEventHandle, 4010)

#define SYM(base, field, version) {#base, #field, offsetof(cudrv_api, field), version},
static const cudrv_sym cudrv_syms[] = {CUDRV_SYMS(SYM)};
#undef SYM

/* Each field's type must be exactly the driver's typedef for the version we ask for. */
#define SYM_CHECK(base, field, version)                                                      \
    _Static_assert(__builtin_types_compatible_p(__typeof__(((cudrv_api *)0)->field),          \
                                                PFN_##base##_v##version),                     \
                   "cudrv_api." #field " is not PFN_" #base "_v" #version);
CUDRV_SYMS(SYM_CHECK)
#undef SYM_CHECK

typedef CUresult (*cudrv_getproc_fn)(const char *symbol, void **pfn, int cuda_version,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *status);

static pthread_once_t cudrv_once = PTHREAD_ONCE_INIT;
static cudrv_api cudrv_table;
static td_err cudrv_status;        /* result of the one load attempt */
static char cudrv_status_msg[512]; /* its message, replayed on every later call */
static int cudrv_n_devices;        /* visible devices after a successful load */

static void *cudrv_resolve(void *lib, cudrv_getproc_fn getproc, const cudrv_sym *s)
{
    void *fn = NULL;
    if (getproc) {
        /* Legacy-stream variants: tandem passes explicit streams everywhere. */
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        if (getproc(s->base, &fn, s->version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st) ==
                CUDA_SUCCESS &&
            st == CU_GET_PROC_ADDRESS_SUCCESS && fn)
            return fn;
    }
    return dlsym(lib, s->exported);
}

/* The driver's name for r, or "CUDA error <n>" when it has none (a stub library). */
static const char *cudrv_result_name(CUresult r)
{
    static _Thread_local char unknown[32];
    const char *name = NULL;
    if (cudrv_table.cuGetErrorName && cudrv_table.cuGetErrorName(r, &name) == CUDA_SUCCESS &&
        name)
        return name;
    snprintf(unknown, sizeof unknown, "CUDA error %d", (int)r);
    return unknown;
}

static const char *cudrv_result_string(CUresult r)
{
    const char *str = NULL;
    if (!cudrv_table.cuGetErrorString || cudrv_table.cuGetErrorString(r, &str) != CUDA_SUCCESS ||
        !str)
        return "no description";
    return str;
}

__attribute__((format(printf, 2, 3))) static td_err cudrv_fail(td_err code, const char *fmt,
                                                                  ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cudrv_status_msg, sizeof cudrv_status_msg, fmt, ap);
    va_end(ap);
    return code;
}

static td_err cudrv_load_once_inner(void)
{
    /* The driver stays loaded for the life of the process: CUDA objects may live until exit. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        return cudrv_fail(TD_ENOTSUP, "no CUDA driver: cannot load libcuda.so.1 (%s)",
                          why ? why : "not found");
    }
    cudrv_getproc_fn getproc = (cudrv_getproc_fn)dlsym(lib, "cuGetProcAddress_v2");
    for (size_t i = 0; i < sizeof cudrv_syms / sizeof cudrv_syms[0]; i++) {
        void *fn = cudrv_resolve(lib, getproc, &cudrv_syms[i]);
        if (!fn)
            return cudrv_fail(TD_ENOTSUP, "CUDA driver too old: no entry point %s (%s)",
                              cudrv_syms[i].base, cudrv_syms[i].exported);
        memcpy((char *)&cudrv_table + cudrv_syms[i].offset, &fn, sizeof fn);
    }
    CUresult r = cudrv_table.cuInit(0);
    /* No GPU, or only the toolkit's stub libcuda: "no CUDA here", not a failure. */
    if (r == CUDA_ERROR_NO_DEVICE || r == CUDA_ERROR_STUB_LIBRARY)
        return cudrv_fail(TD_ENOTSUP, "no CUDA device: cuInit: %s (%s)", cudrv_result_name(r),
                          cudrv_result_string(r));
    if (r != CUDA_SUCCESS)
        return cudrv_fail(TD_ECUDA, "cuInit: %s (%s)", cudrv_result_name(r),
                          cudrv_result_string(r));
    r = cudrv_table.cuDeviceGetCount(&cudrv_n_devices);
    if (r != CUDA_SUCCESS)
        return cudrv_fail(TD_ECUDA, "cuDeviceGetCount: %s (%s)", cudrv_result_name(r),
                          cudrv_result_string(r));
    return TD_OK;
}

static void cudrv_load_once(void)
{
    cudrv_status = cudrv_load_once_inner();
    if (cudrv_status != TD_OK)
        cudrv_n_devices = 0;
}

td_err cudrv_load(void)
{
    pthread_once(&cudrv_once, cudrv_load_once);
    if (cudrv_status != TD_OK)
        return err_set(cudrv_status, "%s", cudrv_status_msg);
    return TD_OK;
}

bool cudrv_available(void)
{
    return cudrv_load() == TD_OK && cudrv_n_devices > 0;
}

const cudrv_api *cudrv_get(void)
{
    pthread_once(&cudrv_once, cudrv_load_once);
    TD_ASSERT(cudrv_status == TD_OK);
    return &cudrv_table;
}

td_err cudrv_check(CUresult result, const char *what)
{
    if (result == CUDA_SUCCESS)
        return TD_OK;
    if (result == CUDA_ERROR_OUT_OF_MEMORY)
        return err_set(TD_ENOMEM, "%s: %s (%s)", what, cudrv_result_name(result),
                       cudrv_result_string(result));
    return err_set(TD_ECUDA, "%s: %s (%s)", what, cudrv_result_name(result),
                   cudrv_result_string(result));
}

td_err cudrv_device_count(int *count)
{
    *count = 0;
    TD_TRY(cudrv_load());
    *count = cudrv_n_devices;
    return TD_OK;
}

td_err cudrv_device_open_ordinal(cudrv_device *dev, int ordinal)
{
    memset(dev, 0, sizeof *dev);
    TD_TRY(cudrv_load());
    if (ordinal < 0 || ordinal >= cudrv_n_devices)
        return err_set(TD_ENOENT, "CUDA device %d does not exist (%d visible)", ordinal,
                       cudrv_n_devices);
    const cudrv_api *api = &cudrv_table;
    CUdevice d;
    CUuuid uuid;
    TD_TRY(cudrv_check(api->cuDeviceGet(&d, ordinal), "cuDeviceGet"));
    TD_TRY(cudrv_check(api->cuDeviceGetUuid_v2(&uuid, d), "cuDeviceGetUuid"));
    TD_TRY(cudrv_check(api->cuDeviceGetName(dev->name, (int)sizeof dev->name - 1, d),
                       "cuDeviceGetName"));
    CUcontext ctx;
    TD_TRY(cudrv_check(api->cuDevicePrimaryCtxRetain(&ctx, d), "cuDevicePrimaryCtxRetain"));
    dev->ordinal = ordinal;
    memcpy(dev->uuid, uuid.bytes, CUDRV_UUID_BYTES);
    dev->ctx = ctx;
    return TD_OK;
}

td_err cudrv_device_open_uuid(cudrv_device *dev, const uint8_t uuid[CUDRV_UUID_BYTES])
{
    memset(dev, 0, sizeof *dev);
    TD_TRY(cudrv_load());
    const cudrv_api *api = &cudrv_table;
    for (int i = 0; i < cudrv_n_devices; i++) {
        CUdevice d;
        CUuuid u;
        TD_TRY(cudrv_check(api->cuDeviceGet(&d, i), "cuDeviceGet"));
        TD_TRY(cudrv_check(api->cuDeviceGetUuid_v2(&u, d), "cuDeviceGetUuid"));
        if (memcmp(u.bytes, uuid, CUDRV_UUID_BYTES) == 0)
            return cudrv_device_open_ordinal(dev, i);
    }
    char s[CUDRV_UUID_STR_LEN];
    cudrv_uuid_format(uuid, s);
    return err_set(TD_ENOENT, "CUDA device %s is not visible to this process (%d visible; "
                   "check CUDA_VISIBLE_DEVICES)", s, cudrv_n_devices);
}

td_err cudrv_device_open(cudrv_device *dev, const char *id)
{
    TD_ASSERT(id);
    memset(dev, 0, sizeof *dev);
    size_t len = strlen(id);
    if (len > 0 && len <= 4 && strspn(id, "0123456789") == len)
        return cudrv_device_open_ordinal(dev, atoi(id));
    uint8_t uuid[CUDRV_UUID_BYTES];
    TD_TRY(cudrv_uuid_parse(id, uuid));
    return cudrv_device_open_uuid(dev, uuid);
}

void cudrv_device_close(cudrv_device *dev)
{
    if (!dev || !dev->ctx)
        return;
    const cudrv_api *api = cudrv_get();
    CUdevice d;
    if (api->cuDeviceGet(&d, dev->ordinal) == CUDA_SUCCESS)
        api->cuDevicePrimaryCtxRelease_v2(d);
    dev->ctx = NULL;
}

td_err cudrv_device_bind(const cudrv_device *dev)
{
    TD_ASSERT(dev && dev->ctx);
    return cudrv_check(cudrv_get()->cuCtxSetCurrent((CUcontext)dev->ctx), "cuCtxSetCurrent");
}

td_err cudrv_ctx_lean(const cudrv_device *dev)
{
    TD_TRY(cudrv_device_bind(dev));
    const cudrv_api *api = cudrv_get();
    TD_TRY(cudrv_check(api->cuCtxSetLimit(CU_LIMIT_STACK_SIZE, CUDRV_LEAN_STACK),
                       "cuCtxSetLimit(stack)"));
    TD_TRY(cudrv_check(api->cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 0), "cuCtxSetLimit(heap)"));
    return cudrv_check(api->cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 0), "cuCtxSetLimit(printf)");
}

td_err cudrv_mem_info(const cudrv_device *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    size_t f = 0, t = 0;
    *free_bytes = *total_bytes = 0;
    TD_TRY(cudrv_device_bind(dev));
    TD_TRY(cudrv_check(cudrv_get()->cuMemGetInfo_v2(&f, &t), "cuMemGetInfo"));
    *free_bytes = f;
    *total_bytes = t;
    return TD_OK;
}

#endif /* TANDEM_HAVE_CUDA */
