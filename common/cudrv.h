/* cudrv: the CUDA driver API, loaded at run time.
 *
 * libcuda is never linked: cudrv_load() dlopen()s "libcuda.so.1" and resolves each entry
 * point through cuGetProcAddress_v2 at the CUDA version whose ABI it declares (or, on drivers
 * older than 12.0, through the explicitly versioned exported symbol), so every binary starts
 * on a machine without a GPU driver and reports "no CUDA" as an ordinary error instead of
 * failing in the dynamic loader.
 *
 * Devices are named by UUID ("GPU-8c4a9a7e-0d6f-...", as nvidia-smi -L prints it), because
 * ordinals depend on CUDA_VISIBLE_DEVICES and differ between processes; an ordinal is
 * accepted too, for a single process's convenience.
 *
 * The driver's types come from cuda.h, included only when TANDEM_HAVE_CUDA is defined; a
 * CPU-only build has the same functions, and cudrv_load() returns TD_ENOTSUP there. */
#ifndef TANDEM_COMMON_CUDRV_H
#define TANDEM_COMMON_CUDRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define CUDRV_UUID_BYTES 16
/* "GPU-" + 32 hex digits + 4 dashes + NUL. */
#define CUDRV_UUID_STR_LEN 41

/* One opened device: the primary context is retained until cudrv_device_close. */
typedef struct cudrv_device {
    int ordinal;                    /* CUdevice ordinal in this process */
    uint8_t uuid[CUDRV_UUID_BYTES]; /* identity that is the same in every process */
    char name[96];                  /* marketing name, for logs */
    void *ctx;                      /* CUcontext: the device's primary context, retained */
} cudrv_device;

/* Loads libcuda and calls cuInit once per process (thread-safe; later calls return the
 * first result again). TD_ENOTSUP when this build has no CUDA, the driver library is
 * missing, or the driver sees no device; TD_ECUDA when the driver fails otherwise. */
td_err cudrv_load(void);

/* True when cudrv_load succeeded and at least one device is visible. */
bool cudrv_available(void);

/* Number of visible devices. */
td_err cudrv_device_count(int *count);

/* Opens a device by "GPU-<uuid>", "MIG-<uuid>", a bare dashed/undashed uuid, or a decimal
 * ordinal; retains its primary context. TD_ENOENT when no visible device matches. */
td_err cudrv_device_open(cudrv_device *dev, const char *id);
td_err cudrv_device_open_ordinal(cudrv_device *dev, int ordinal);
td_err cudrv_device_open_uuid(cudrv_device *dev, const uint8_t uuid[CUDRV_UUID_BYTES]);

/* Releases the primary context retained by cudrv_device_open*; safe on a zeroed device. */
void cudrv_device_close(cudrv_device *dev);

/* Makes the device's primary context current on the calling thread. */
td_err cudrv_device_bind(const cudrv_device *dev);

/* Gives back what the device's primary context holds for kernels a process that launches
 * none of its own never uses: the per-thread stack reserved for every thread the GPU can hold
 * (1 KiB each by default: ~270 MiB on an H100), the device malloc heap and the printf buffer.
 * A kernel that needs more stack than the limit raises it when launched. */
#define CUDRV_LEAN_STACK 16 /* bytes per thread */
td_err cudrv_ctx_lean(const cudrv_device *dev);

/* Bytes of the device's memory free now (to every process) and in all (cuMemGetInfo in its
 * primary context, made current on the calling thread). */
td_err cudrv_mem_info(const cudrv_device *dev, uint64_t *free_bytes, uint64_t *total_bytes);

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (lower-case hex). */
void cudrv_uuid_format(const uint8_t uuid[CUDRV_UUID_BYTES], char out[CUDRV_UUID_STR_LEN]);

/* Parses what cudrv_uuid_format writes; the "GPU-"/"MIG-" prefix and dashes are optional,
 * hex may be upper case. TD_EINVAL on anything else. */
td_err cudrv_uuid_parse(const char *s, uint8_t uuid[CUDRV_UUID_BYTES]);

#ifdef TANDEM_HAVE_CUDA
#include <cuda.h>

/* The entry points tandem uses. Each field is named after the driver symbol it holds
 * (the versioned one where the ABI is versioned) so the CUDA documentation applies as is;
 * cuda.h's own prototypes are never called, since nothing links libcuda. */
typedef struct cudrv_api {
    CUresult (*cuInit)(unsigned int flags);
    CUresult (*cuDriverGetVersion)(int *version);
    CUresult (*cuGetErrorName)(CUresult error, const char **str);
    CUresult (*cuGetErrorString)(CUresult error, const char **str);

    CUresult (*cuDeviceGetCount)(int *count);
    CUresult (*cuDeviceGet)(CUdevice *device, int ordinal);
    CUresult (*cuDeviceGetUuid_v2)(CUuuid *uuid, CUdevice dev);
    CUresult (*cuDeviceGetName)(char *name, int len, CUdevice dev);
    CUresult (*cuDeviceGetAttribute)(int *value, CUdevice_attribute attrib, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice dev);
    CUresult (*cuCtxSetCurrent)(CUcontext ctx);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuCtxSetLimit)(CUlimit limit, size_t value);
    CUresult (*cuMemGetInfo_v2)(size_t *free_bytes, size_t *total_bytes);

    /* Virtual memory management: shareable allocations. */
    CUresult (*cuMemGetAllocationGranularity)(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option);
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle handle);
    CUresult (*cuMemExportToShareableHandle)(void *shareable, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType type,
                                             unsigned long long flags);
    CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *handle,
                                               void *os_handle, CUmemAllocationHandleType type);
    CUresult (*cuMemAddressReserve)(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags);
    CUresult (*cuMemAddressFree)(CUdeviceptr ptr, size_t size);
    CUresult (*cuMemMap)(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags);
    CUresult (*cuMemUnmap)(CUdeviceptr ptr, size_t size);
    CUresult (*cuMemSetAccess)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count);

    /* Copies and fills (legacy default stream for the synchronous ones). */
    CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr dst, const void *src, size_t bytes);
    CUresult (*cuMemcpyDtoH_v2)(void *dst, CUdeviceptr src, size_t bytes);
    CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr dst, const void *src, size_t bytes,
                                     CUstream stream);
    CUresult (*cuMemcpyDtoHAsync_v2)(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
    CUresult (*cuMemsetD8_v2)(CUdeviceptr dst, unsigned char value, size_t bytes);
    CUresult (*cuMemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t bytes,
                                CUstream stream);

    /* Streams and (interprocess) events. */
    CUresult (*cuStreamCreate)(CUstream *stream, unsigned int flags);
    CUresult (*cuStreamDestroy_v2)(CUstream stream);
    CUresult (*cuStreamSynchronize)(CUstream stream);
    CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned int flags);
    CUresult (*cuEventCreate)(CUevent *event, unsigned int flags);
    CUresult (*cuEventRecord)(CUevent event, CUstream stream);
    CUresult (*cuEventSynchronize)(CUevent event);
    CUresult (*cuEventDestroy_v2)(CUevent event);
    CUresult (*cuIpcGetEventHandle)(CUipcEventHandle *handle, CUevent event);
    CUresult (*cuIpcOpenEventHandle)(CUevent *event, CUipcEventHandle handle);
} cudrv_api;

/* The loaded entry points; asserts that cudrv_load() succeeded (a programmer error
 * otherwise: check cudrv_load's result first). */
const cudrv_api *cudrv_get(void);

/* Turns a failed driver call into TD_ECUDA with "<what>: CUDA_ERROR_X (description)";
 * returns TD_OK for CUDA_SUCCESS. Use: TD_TRY(cudrv_check(api->cuMemCreate(...), "cuMemCreate")). */
td_err cudrv_check(CUresult result, const char *what);
#endif

#endif
