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
#include "kernels/cuda/matmul_float.cuh"

namespace {

using namespace mmf;

/* grid: the set's units of RW rows (member after member) times n_ttiles token tiles, token
 * tile fastest (CTAs sharing rows run together and share the weights through L2); block:
 * KSPLIT warps. */
template <int TT>
__global__ void __launch_bounds__(KSPLIT * 32)
    mmf_kernel(bool early, mm_set set, size_t row_bytes, int64_t cols, const float *x,
               int n_tok, int n_ttiles, bool vec)
{
    pdl_enter(early);
    __shared__ cta_red<TT> red;
    const int64_t u = blockIdx.x / n_ttiles;
    const int t0 = (int)(blockIdx.x % n_ttiles) * TT;
    cta<TT>(set, u, t0, row_bytes, cols, x, n_tok, vec, red,
            [&](int m, int64_t row, int tok, float v) {
                set.y[m][(size_t)tok * set.rows[m] + row] = v;
            });
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
    for (int i = 0; i < n; i++)
        TD_ASSERT(mm[i].w->type == TD_F32 && mm[i].w->cols == w->cols);
    return launch_tok(mm_set_of(mm, n, RW), w, x, n_tok, vec_ok(mm, n, x), st);
}
