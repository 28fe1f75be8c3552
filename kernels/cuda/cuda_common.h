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

/* After a launch: the launch configuration was accepted. */
#define CUDA_TRY_LAUNCH() CUDA_TRY(cudaGetLastError())

static inline unsigned cuda_blocks(long long n, unsigned per_block)
{
    return (unsigned)((n + per_block - 1) / per_block);
}

#endif
