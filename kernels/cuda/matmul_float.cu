/* y = x . W^T for F32 weights: f32 FMAs on the CUDA cores (F16/BF16 weights take the
 * tensor cores, matmul_float_mma.cu).
 *
 * One idea: the weights and activations are f32, so there is nothing to round before the
 * products; each lane streams 8 consecutive weights of 4 rows per two 16-byte loads and
 * reuses them for up to 8 tokens. Reduction order per (row, token), independent of n_tok:
 * CTA = 4 warps over 4 rows; warp w owns the 256-column chunks w, w+4, ...; lane l takes
 * columns 8l..8l+7 of each chunk and accumulates acc = fma(w, x, acc) over its chunks in
 * increasing order, columns in increasing order; the lanes are summed by a butterfly (xor
 * 16, 8, 4, 2, 1), the warps as ((p0 + p1) + p2) + p3. A token tile only chooses which
 * tokens a CTA handles, never the order, so batch size never changes a result.
 *
 * Performance is secondary here (the 27B model's F32 tensors are norms and small ssm
 * vectors): one token is bandwidth-bound, many tokens FMA-bound. */
#include <stdint.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_internal.h"

namespace {

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

/* grid: the set's units of RW rows (member after member) times n_ttiles token tiles, token
 * tile fastest (CTAs sharing rows run together and share the weights through L2); block:
 * KSPLIT warps. */
template <int TT>
__global__ void __launch_bounds__(KSPLIT * 32)
    mmf_kernel(bool early, mm_set set, size_t row_bytes, int64_t cols, const float *x,
               int n_tok, int n_ttiles, bool vec)
{
    pdl_enter(early);
    __shared__ float red[KSPLIT][RW][TT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t u = blockIdx.x / n_ttiles;
    const int m = mm_set_member(&set, u);
    const int64_t r0 = (u - set.first[m]) * RW, rows = set.rows[m];
    const uint8_t *w = set.w[m];
    float *y = set.y[m];
    const int t0 = (int)(blockIdx.x % n_ttiles) * TT;

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
            for (int m = 16; m >= 1; m >>= 1) /* both partners add the same pair */
                v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, m));
            if (lane == 0)
                red[warp][r][tt] = v;
        }
    __syncthreads();
    if (threadIdx.x < RW * TT) {
        const int r = threadIdx.x / TT, tt = threadIdx.x % TT;
        if (r0 + r < rows && t0 + tt < n_tok) {
            float v = red[0][r][tt];
#pragma unroll
            for (int k = 1; k < KSPLIT; k++)
                v = __fadd_rn(v, red[k][r][tt]);
            y[(size_t)(t0 + tt) * rows + r0 + r] = v;
        }
    }
}

template <int TT>
td_err launch(const mm_set &set, const ops_weight *w, const float *x, int n_tok, bool vec,
              cudaStream_t st)
{
    const int n_ttiles = (n_tok + TT - 1) / TT;
    const int64_t n_cta = set.first[set.n] * n_ttiles;
    if (n_cta > 0x7fffffff)
        return err_set(TD_ENOTSUP, "matmul of %lld rows needs more CTAs than a grid holds",
                       (long long)(set.first[set.n] * RW));
    return pdl_launch<mmf_kernel<TT>>("F32 matmul", dim3((unsigned)n_cta), dim3(KSPLIT * 32), 0,
                                      st, set, w->row_bytes, w->cols, x, n_tok, n_ttiles, vec);
}

td_err launch_tok(const mm_set &set, const ops_weight *w, const float *x, int n_tok, bool vec,
                  cudaStream_t st)
{
    if (n_tok == 1)
        return launch<1>(set, w, x, n_tok, vec, st);
    if (n_tok == 2)
        return launch<2>(set, w, x, n_tok, vec, st);
    if (n_tok <= 4)
        return launch<4>(set, w, x, n_tok, vec, st);
    return launch<8>(set, w, x, n_tok, vec, st);
}

} /* namespace */

td_err mmf_launch(const ops_mm_out *mm, int n, const float *x, int n_tok, cudaStream_t st)
{
    TD_ASSERT(n_tok >= 1 && n_tok <= MM_CHUNK && n >= 1 && n <= MM_SET_MAX);
    const ops_weight *w = mm[0].w;
    bool vec = ((uintptr_t)x & 15) == 0 && (w->row_bytes & 15) == 0 && w->cols % LANE_W == 0;
    for (int i = 0; i < n; i++) {
        TD_ASSERT(mm[i].w->type == TD_F32 && mm[i].w->cols == w->cols);
        vec = vec && ((uintptr_t)mm[i].w->data & 15) == 0;
    }
    return launch_tok(mm_set_of(mm, n, RW), w, x, n_tok, vec, st);
}
