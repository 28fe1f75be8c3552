/* Device buffers kept per (device, stream): the rounded activations of the quantised
 * matmuls (matmul.cu), the split activations of the F16/BF16 ones (matmul_float_mma.cu) and
 * attention's split partials (attention.cu) each keep one table of them. Include only from
 * .cu files.
 *
 * Why one buffer per stream is enough: work on one stream is ordered (every kernel waits for
 * the one before it, launch.cuh), so a kernel never overwrites what an earlier one on the
 * stream still reads, and streams running side by side never share a buffer. A buffer grows
 * on demand and is kept for the process; growing frees the old one (cudaFree waits for the
 * device) and cannot happen while a stream is captured, nor after a recording that names the
 * buffer: the matmul buffers are grown to their largest before every capture
 * (cuda_graph_prepare), attention's is made at its full size once and never grows. */
#ifndef TANDEM_KERNELS_CUDA_STREAM_BUF_CUH
#define TANDEM_KERNELS_CUDA_STREAM_BUF_CUH

#include <pthread.h>
#include <stddef.h>

#include "kernels/cuda/cuda_common.h"

#define STREAM_BUF_SLOTS 64

typedef struct stream_buf {
    int dev;                 /* device ordinal */
    cudaStream_t st;         /* stream the buffer serves */
    void *buf;               /* device memory */
    size_t cap;              /* bytes */
    bool used;               /* the slot belongs to (dev, st) */
    unsigned long long mark; /* the owner's word (matmul.cu: mm_mark) */
} stream_buf;

typedef struct stream_bufs {
    const char *what; /* names the buffers in error messages */
    pthread_mutex_t lock;
    stream_buf slot[STREAM_BUF_SLOTS];
} stream_bufs;

#define STREAM_BUFS_INIT(what) {what, PTHREAD_MUTEX_INITIALIZER, {}}

/* The buffer of st on the current device in t (*out, *slot; slot may be NULL), at least need
 * bytes: grown to whole MiB when smaller, or, when grow is false, *out NULL and nothing
 * changed. TD_ENOMEM when all slots are taken or the device has no room. A new slot's mark
 * starts at ~0. */
td_err stream_buf_get(stream_bufs *t, cudaStream_t st, size_t need, bool grow, void **out,
                      stream_buf **slot);

#endif
