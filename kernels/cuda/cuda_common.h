/* What every CUDA kernel file shares: error checks that turn CUDA failures into td_err
 * messages (a GPU running out of memory is an error from outside, not a crash), launch
 * helpers, and the stream type the C side sees. Include only from .cu files. */
#ifndef TANDEM_KERNELS_CUDA_COMMON_H
#define TANDEM_KERNELS_CUDA_COMMON_H

#include <cuda_runtime.h>

extern "C" {
#include "common/err.h"
#include "kernels/ops.h"
}

/* Returns TD_ECUDA with the call, file:line and CUDA's message when expr fails. */
#define CUDA_TRY(expr)                                                                       \
    do {                                                                                     \
        cudaError_t cuda_try_e_ = (expr);                                                    \
        if (cuda_try_e_ != cudaSuccess)                                                      \
            return err_set(TD_ECUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #expr,             \
                           cudaGetErrorString(cuda_try_e_));                                 \
    } while (0)

/* Kernel launches so far (kernels/cuda/prof.cu; read with cuda_launch_count). A relaxed
 * atomic add: nothing waits on it. */
extern unsigned long long cuda_launches;
static inline void cuda_launch_note(unsigned n)
{
    __atomic_fetch_add(&cuda_launches, (unsigned long long)n, __ATOMIC_RELAXED);
}

/* After a launch: counts it, and checks the launch configuration was accepted. */
#define CUDA_TRY_LAUNCH()                                                                    \
    do {                                                                                     \
        cuda_launch_note(1);                                                                 \
        CUDA_TRY(cudaGetLastError());                                                        \
    } while (0)

static inline unsigned cuda_blocks(long long n, unsigned per_block)
{
    return (unsigned)((n + per_block - 1) / per_block);
}

#endif
