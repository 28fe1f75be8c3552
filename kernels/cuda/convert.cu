/* Element type conversions of whole arrays (twins of kernels/cpu/convert.c). */
#include <cuda_fp16.h>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_dev.cuh"

#define CVT_THREADS 256
#define CVT_MAX_BLOCKS 4096

/* Blocks of a grid-strided conversion of n elements. */
static unsigned cvt_blocks(int64_t n)
{
    const long long blocks = ((long long)n + CVT_THREADS - 1) / CVT_THREADS;
    return (unsigned)(blocks > CVT_MAX_BLOCKS ? CVT_MAX_BLOCKS : blocks);
}

__global__ void __launch_bounds__(CVT_THREADS)
to_f16_kernel(bool early, uint16_t *out, const float *x, int64_t n)
{
    pdl_enter(early);
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
    return pdl_launch<to_f16_kernel>("to_f16", dim3(cvt_blocks(n)), dim3(CVT_THREADS), 0, st,
                                     out, x, n);
}

/* ops_f32_to_bf16's bits: nearest even, a NaN quieted with its high payload kept. */
__device__ __forceinline__ uint16_t dev_f32_to_bf16(float f)
{
    const uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

__global__ void __launch_bounds__(CVT_THREADS)
to_bf16_kernel(bool early, uint16_t *out, const float *x, int64_t n)
{
    pdl_enter(early);
    const int64_t step = (int64_t)gridDim.x * CVT_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * CVT_THREADS + threadIdx.x; i < n; i += step)
        out[i] = dev_f32_to_bf16(x[i]);
}

__global__ void __launch_bounds__(CVT_THREADS)
from_bf16_kernel(bool early, float *out, const uint16_t *x, int64_t n)
{
    pdl_enter(early);
    const int64_t step = (int64_t)gridDim.x * CVT_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * CVT_THREADS + threadIdx.x; i < n; i += step)
        out[i] = __uint_as_float((uint32_t)x[i] << 16);
}

extern "C" td_err cuda_to_bf16(uint16_t *out, const float *x, int64_t n, ops_stream st)
{
    TD_ASSERT(n >= 0);
    if (n == 0)
        return TD_OK;
    TD_ASSERT(out != NULL && x != NULL);
    return pdl_launch<to_bf16_kernel>("to_bf16", dim3(cvt_blocks(n)), dim3(CVT_THREADS), 0, st,
                                      out, x, n);
}

extern "C" td_err cuda_from_bf16(float *out, const uint16_t *x, int64_t n, ops_stream st)
{
    TD_ASSERT(n >= 0);
    if (n == 0)
        return TD_OK;
    TD_ASSERT(out != NULL && x != NULL);
    return pdl_launch<from_bf16_kernel>("from_bf16", dim3(cvt_blocks(n)), dim3(CVT_THREADS), 0,
                                        st, out, x, n);
}

/* grid (n_tok, 2): block (t, 0) stores token t's key row, (t, 1) its value row */
__global__ void __launch_bounds__(CVT_THREADS)
kv_store_kernel(bool early, void *k_cache, void *v_cache, bool f16, const float *k,
                const float *v, const int32_t *rows, int64_t row)
{
    pdl_enter(early);
    const int64_t t = blockIdx.x;
    const float *src = (blockIdx.y ? v : k) + t * row;
    const int64_t at = (int64_t)rows[t] * row;
    if (f16) {
        uint16_t *dst = (uint16_t *)(blockIdx.y ? v_cache : k_cache) + at;
        for (int64_t i = threadIdx.x; i < row; i += CVT_THREADS)
            dst[i] = __half_as_ushort(__float2half_rn(src[i]));
    } else {
        float *dst = (float *)(blockIdx.y ? v_cache : k_cache) + at;
        for (int64_t i = threadIdx.x; i < row; i += CVT_THREADS)
            dst[i] = src[i];
    }
}

extern "C" td_err cuda_kv_store(void *k_cache, void *v_cache, td_dtype type, const float *k,
                                const float *v, const int32_t *rows, int64_t n_tok, int64_t row,
                                ops_stream st)
{
    TD_ASSERT(type == TD_F32 || type == TD_F16);
    TD_ASSERT(n_tok >= 0 && row >= 1 && (n_tok == 0 || (k && v && rows && k_cache && v_cache)));
    if (n_tok > INT32_MAX)
        return err_set(TD_ENOTSUP, "kv_store of %lld tokens", (long long)n_tok);
    if (n_tok == 0)
        return TD_OK;
    return pdl_launch<kv_store_kernel>("kv_store", dim3((unsigned)n_tok, 2), dim3(CVT_THREADS), 0,
                                       st, k_cache, v_cache, type == TD_F16, k, v, rows, row);
}
