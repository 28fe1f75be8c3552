/* Element type conversions of whole arrays (twins of kernels/cpu/convert.c). */
#include <cuda_fp16.h>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_dev.cuh"

#define CVT_THREADS 256
#define CVT_MAX_BLOCKS 4096

/* The conversions, one element each: binary16 and bfloat16 rounded to nearest even with the
 * CPU's bits (ops_f32_to_f16, ops_f32_to_bf16: a NaN quieted with its high payload kept), and
 * bfloat16 widened exactly. */
struct cvt_to_f16 {
    __device__ uint16_t operator()(float v) const { return __half_as_ushort(__float2half_rn(v)); }
};

struct cvt_to_bf16 {
    __device__ uint16_t operator()(float v) const
    {
        const uint32_t x = __float_as_uint(v);
        if ((x & 0x7fffffffu) > 0x7f800000u)
            return (uint16_t)((x >> 16) | 0x40);
        return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
    }
};

struct cvt_from_bf16 {
    __device__ float operator()(uint16_t h) const { return __uint_as_float((uint32_t)h << 16); }
};

template <typename O, typename I, typename C>
__global__ void __launch_bounds__(CVT_THREADS)
convert_kernel(bool early, O *out, const I *x, int64_t n)
{
    pdl_enter(early);
    const int64_t step = (int64_t)gridDim.x * CVT_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * CVT_THREADS + threadIdx.x; i < n; i += step)
        out[i] = C()(x[i]);
}

/* out[n] = C(x[n]), grid-strided, a link of the stream's programmatic chain. */
template <typename O, typename I, typename C>
static td_err convert(const char *what, O *out, const I *x, int64_t n, ops_stream st)
{
    TD_ASSERT(n >= 0);
    if (n == 0)
        return TD_OK;
    TD_ASSERT(out != NULL && x != NULL);
    const long long blocks = ((long long)n + CVT_THREADS - 1) / CVT_THREADS;
    return pdl_launch<convert_kernel<O, I, C>>(
        what, dim3((unsigned)(blocks > CVT_MAX_BLOCKS ? CVT_MAX_BLOCKS : blocks)),
        dim3(CVT_THREADS), 0, st, out, x, n);
}

extern "C" td_err cuda_to_f16(uint16_t *out, const float *x, int64_t n, ops_stream st)
{
    return convert<uint16_t, float, cvt_to_f16>("to_f16", out, x, n, st);
}

extern "C" td_err cuda_to_bf16(uint16_t *out, const float *x, int64_t n, ops_stream st)
{
    return convert<uint16_t, float, cvt_to_bf16>("to_bf16", out, x, n, st);
}

extern "C" td_err cuda_from_bf16(float *out, const uint16_t *x, int64_t n, ops_stream st)
{
    return convert<float, uint16_t, cvt_from_bf16>("from_bf16", out, x, n, st);
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
