/* cuda_get_rows and cuda_dequantize_row: one thread per output element.
 *
 * These serve the token embedding (a few rows per step) and tests, not the matmul, so the
 * kernel favours being obviously equal to kernels/cpu/quant.c over speed: each element is
 * decoded from its block with the CPU's arithmetic in the same order ((d * sc) * q -
 * dmin * m in f32, products rounded one at a time), which makes every value bit-identical to
 * cpu_dequantize_row. Fields are read byte by byte, so any source alignment works. */
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/kquant.h"

namespace {

__device__ __forceinline__ uint32_t ld_u16(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}

__device__ __forceinline__ float f16f(uint32_t h)
{
    return __half2float(__ushort_as_half((unsigned short)h));
}

/* Element i of a row of type that starts at row (block-aligned). */
__device__ float dq_elem(int type, const uint8_t *row, int64_t i)
{
    switch (type) {
    case TD_F32: {
        const uint8_t *p = row + 4 * i;
        return __uint_as_float(ld_u16(p) | (ld_u16(p + 2) << 16));
    }
    case TD_F16:
        return f16f(ld_u16(row + 2 * i));
    case TD_BF16:
        return __uint_as_float(ld_u16(row + 2 * i) << 16);
    case TD_Q8_0: {
        const uint8_t *b = row + (i / 32) * 34;
        return __fmul_rn(f16f(ld_u16(b)), (float)(int8_t)b[2 + i % 32]);
    }
    case TD_Q4_K:
    case TD_Q5_K: {
        const bool q5 = type == TD_Q5_K;
        const uint8_t *b = row + (i / 256) * (q5 ? 176 : 144);
        const int e = (int)(i % 256), c = e / 64, hi = (e % 64) / 32, l = e % 32;
        int sc, m;
        kq_scale_min(b + 4, 2 * c + hi, &sc, &m);
        int q = (b[(q5 ? 48 : 16) + 32 * c + l] >> (4 * hi)) & 0xF;
        if (q5)
            q |= ((b[16 + l] >> (2 * c + hi)) & 1) << 4;
        const float d0 = __fmul_rn(f16f(ld_u16(b)), (float)sc);
        const float dm0 = __fmul_rn(f16f(ld_u16(b + 2)), (float)m);
        return __fsub_rn(__fmul_rn(d0, (float)q), dm0);
    }
    case TD_Q6_K: {
        const uint8_t *b = row + (i / 256) * 210;
        const int e = (int)(i % 256), n = e / 128, qq = (e % 128) / 32, l = e % 32;
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        const int lo = (qq & 1 ? ql[l + 32] : ql[l]) >> (qq & 2 ? 4 : 0) & 0xF;
        const int w = (lo | ((qh[l] >> (2 * qq)) & 3) << 4) - 32;
        const int sc = (int8_t)b[192 + 8 * n + l / 16 + 2 * qq];
        const float s = __fmul_rn(f16f(ld_u16(b + 208)), (float)sc);
        return __fmul_rn(s, (float)w);
    }
    }
    return __int_as_float(0x7fc00000); /* unreachable: the host checked the type */
}

/* grid (ceil(cols / 256), n rows); out[r][c] = row ids[r] of w, NaN for a bad id. */
__global__ void get_rows_kernel(bool early, float *out, const uint8_t *w, int type,
                                size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids)
{
    pdl_enter(early); /* before the return below: every thread waits */
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols)
        return;
    const int32_t id = ids[blockIdx.y];
    out[(size_t)blockIdx.y * cols + c] = id >= 0 && id < rows
                                             ? dq_elem(type, w + (size_t)id * row_bytes, c)
                                             : __int_as_float(0x7fc00000);
}

__global__ void dequant_kernel(bool early, float *dst, const uint8_t *src, int type, int64_t n)
{
    pdl_enter(early);
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        dst[i] = dq_elem(type, src, i);
}

td_err check_row(td_dtype type, int64_t n)
{
    if (!ops_type_supported(type))
        return err_set(TD_ENOTSUP, "type %s (%d) is not supported by the ops", dtype_name(type),
                       (int)type);
    const dtype_info *info = dtype_get(type);
    if (n < 0 || n % info->block != 0)
        return err_set(TD_EINVAL, "%lld elements of %s: not a multiple of the block size %u",
                       (long long)n, info->name, info->block);
    return TD_OK;
}

} /* namespace */

td_err cuda_dequantize_row(td_dtype type, const void *src, float *dst, int64_t n,
                           ops_stream st)
{
    TD_TRY(check_row(type, n));
    if (n == 0)
        return TD_OK;
    const int64_t blocks = (n + 255) / 256;
    const unsigned grid = (unsigned)(blocks < 65536 ? blocks : 65536);
    return pdl_launch<dequant_kernel>("dequantize", dim3(grid), dim3(256), 0, st, dst,
                                      (const uint8_t *)src, (int)type, n);
}

td_err cuda_get_rows(float *out, const ops_weight *w, const int32_t *ids, int64_t n,
                     ops_stream st)
{
    TD_ASSERT(out != NULL && w != NULL && ids != NULL && n >= 0);
    TD_TRY(check_row(w->type, w->cols));
    const unsigned gx = (unsigned)((w->cols + 255) / 256);
    for (int64_t i0 = 0; i0 < n; i0 += 65535) { /* gridDim.y limit */
        const unsigned ny = (unsigned)(n - i0 < 65535 ? n - i0 : 65535);
        TD_TRY(pdl_launch<get_rows_kernel>("get_rows", dim3(gx, ny), dim3(256), 0, st,
                                           out + (size_t)i0 * w->cols, (const uint8_t *)w->data,
                                           (int)w->type, w->row_bytes, w->rows, w->cols,
                                           ids + i0));
    }
    return TD_OK;
}
