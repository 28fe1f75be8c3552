/* Element type conversions of whole arrays (twins of kernels/cpu/convert.c). */
#include <cuda_fp16.h>

#include "kernels/cuda/ops_dev.cuh"

#define CVT_THREADS 256
#define CVT_MAX_BLOCKS 4096

__global__ void __launch_bounds__(CVT_THREADS) to_f16_kernel(uint16_t *out, const float *x, int64_t n)
{
    const int64_t step = (int64_t)gridDim.x * CVT_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * CVT_THREADS + threadIdx.x; i < n; i += step)
        out[i] = __half_as_ushort(__float2half_rn(x[i]));
}

extern "C" td_err cuda_to_f16(uint16_t *out, const float *x, int64_t n, ops_stream st)
{
    TD_ASSERT(n >= 0);
    if (n == 0)
        return TD_OK;
    TD_ASSERT(out != NULL && x != NULL);
    long long blocks = ((long long)n + CVT_THREADS - 1) / CVT_THREADS;
    if (blocks > CVT_MAX_BLOCKS)
        blocks = CVT_MAX_BLOCKS;
    to_f16_kernel<<<(unsigned)blocks, CVT_THREADS, 0, st>>>(out, x, n);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}
