/* The cuda kind of shared buffer, behind common/shbuf.c (not a public header: use shbuf.h).
 * Without CUDA every function returns TD_ENOTSUP. Each function makes the buffer's device
 * context current on the calling thread, since driver calls act on the current context. */
#ifndef TANDEM_COMMON_SHBUF_CUDA_H
#define TANDEM_COMMON_SHBUF_CUDA_H

#include <stdint.h>

#include "common/cudrv.h"
#include "common/err.h"

typedef struct shbuf_cuda shbuf_cuda;

/* A zero-filled allocation of at least size bytes on dev; uuid receives dev's UUID. */
td_err shbuf_cuda_create(shbuf_cuda **out, uint64_t size, const cudrv_device *dev,
                         uint8_t uuid[CUDRV_UUID_BYTES]);

/* A new close-on-exec POSIX fd for the allocation. */
td_err shbuf_cuda_export(const shbuf_cuda *m, int *fd);

/* Imports fd (not consumed) and maps size bytes of it on the GPU named by uuid. */
td_err shbuf_cuda_import(shbuf_cuda **out, uint64_t size, const uint8_t uuid[CUDRV_UUID_BYTES],
                         int fd);

uint64_t shbuf_cuda_devptr(const shbuf_cuda *m); /* CUdeviceptr of the mapping */

void shbuf_cuda_release(shbuf_cuda *m);

#endif
