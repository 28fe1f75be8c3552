/* The F32 matmul's CTA (matmul_float.cu), as a device function for the kernels that run it
 * among other work (deltanet_in.cu): the same loads, order and reduction, so the same bits.
 * Include only from .cu files. */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_FLOAT_CUH
#define TANDEM_KERNELS_CUDA_MATMUL_FLOAT_CUH

#include <stdint.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_internal.h"

namespace mmf {

constexpr int KSPLIT = 4;  /* warps per CTA, each owning every 4th 256-column chunk */
constexpr int RW = 4;      /* weight rows per CTA */
constexpr int LANE_W = 8;  /* consecutive columns per lane per chunk */
constexpr int CHUNK = 32 * LANE_W;

/* w[0..7] = row[col..col+7] (zeros past cols). vec: 16-byte aligned loads are allowed
 * (data, row size and x all aligned and cols % 8 == 0, so a lane's 8 columns are either all
 * inside the row or all outside). */
__device__ __forceinline__ void load_w8(float (&v)[LANE_W], const uint8_t *row, int64_t col,
                                        int64_t cols, bool vec)
{
    const float *p = (const float *)row + col;
    if (vec) {
        const float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < LANE_W; e++)
            v[e] = col + e < cols ? __ldg(p + e) : 0.0f;
    }
}

__device__ __forceinline__ void load_x8(float (&v)[LANE_W], const float *xt, int64_t col,
                                        int64_t cols, bool vec)
{
    if (vec) {
        const float4 a = __ldg((const float4 *)(xt + col));
        const float4 b = __ldg((const float4 *)(xt + col) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < LANE_W; e++)
            v[e] = col + e < cols ? __ldg(xt + col + e) : 0.0f;
    }
}

/* The shared memory of one CTA's reduction. */
template <int TT> struct cta_red {
    float v[KSPLIT][RW][TT];
};

/* Asks for the RW rows of the set's unit u into L2 (a 128-byte line per thread and step;
 * nothing waits): what a CTA may do with its weights before its dependency wait. */
__device__ __forceinline__ void prefetch_rows(const mm_set &set, int64_t u, size_t row_bytes)
{
    const int m = mm_set_member(&set, u);
    const int64_t r0 = (u - set.first[m]) * RW, rows = set.rows[m];
    const uint8_t *w = set.w[m];
    const int n = r0 + RW <= rows ? RW : (int)(rows - r0);
    const size_t lines = (row_bytes + 127) / 128;
    for (size_t i = threadIdx.x; i < (size_t)n * lines; i += blockDim.x)
        dev_prefetch_l2(w + (size_t)(r0 + (int64_t)(i / lines)) * row_bytes + (i % lines) * 128);
}

/* One CTA (KSPLIT warps) of the set's unit u (RW rows of member m) for tokens t0..t0+TT-1 of
 * x[n_tok][cols]: store(m, row, token, value) for each row and token that exists, called by
 * threads 0..RW*TT-1 after a __syncthreads. */
template <int TT, class Store>
__device__ __forceinline__ void cta(const mm_set &set, int64_t u, int t0, size_t row_bytes,
                                    int64_t cols, const float *x, int n_tok, bool vec,
                                    cta_red<TT> &red, Store store)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int m = mm_set_member(&set, u);
    const int64_t r0 = (u - set.first[m]) * RW, rows = set.rows[m];
    const uint8_t *w = set.w[m];

    float acc[RW][TT];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
            acc[r][tt] = 0.0f;

    for (int64_t c0 = (int64_t)warp * CHUNK; c0 < cols; c0 += (int64_t)KSPLIT * CHUNK) {
        const int64_t col = c0 + LANE_W * lane;
        if (col >= cols)
            continue;
        float wv[RW][LANE_W];
#pragma unroll
        for (int r = 0; r < RW; r++) {
            if (r0 + r < rows) {
                load_w8(wv[r], w + (size_t)(r0 + r) * row_bytes, col, cols, vec);
            } else {
#pragma unroll
                for (int e = 0; e < LANE_W; e++)
                    wv[r][e] = 0.0f;
            }
        }
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            if (t0 + tt >= n_tok)
                break;
            float xv[LANE_W];
            load_x8(xv, x + (size_t)(t0 + tt) * cols, col, cols, vec);
#pragma unroll
            for (int r = 0; r < RW; r++)
#pragma unroll
                for (int e = 0; e < LANE_W; e++)
                    acc[r][tt] = __fmaf_rn(wv[r][e], xv[e], acc[r][tt]);
        }
    }

#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            float v = acc[r][tt];
#pragma unroll
            for (int k = 16; k >= 1; k >>= 1) /* both partners add the same pair */
                v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, k));
            if (lane == 0)
                red.v[warp][r][tt] = v;
        }
    __syncthreads();
    if (threadIdx.x < RW * TT) {
        const int r = threadIdx.x / TT, tt = threadIdx.x % TT;
        if (r0 + r < rows && t0 + tt < n_tok) {
            float v = red.v[0][r][tt];
#pragma unroll
            for (int k = 1; k < KSPLIT; k++)
                v = __fadd_rn(v, red.v[k][r][tt]);
            store(m, r0 + r, t0 + tt, v);
        }
    }
}

/* Whether 16-byte loads may serve x[.][cols] and the weights of mm[0..n-1]. */
__host__ __forceinline__ bool vec_ok(const ops_mm_out *mm, int n, const float *x)
{
    const ops_weight *w = mm[0].w;
    bool vec = ((uintptr_t)x & 15) == 0 && (w->row_bytes & 15) == 0 && w->cols % LANE_W == 0;
    for (int i = 0; i < n; i++)
        vec = vec && ((uintptr_t)mm[i].w->data & 15) == 0;
    return vec;
}

} /* namespace mmf */

#endif
