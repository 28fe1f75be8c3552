/* Gated delta rule, token by token (twin of kernels/cpu/delta.c).
 *
 * Every step of the recurrence works on columns of S independently: with S [d_k][d_v],
 * column j needs only S[:, j], k, q, v_j, g and beta (kv_j = sum_i S[i][j] k[i], then
 * S[:, j] += k u_j, o_j = sum_i S[i][j] q[i]). So one thread owns one column in registers
 * for the whole sequence and sums over i in order, alone: no reduction between threads, no
 * shared accumulator, and the arithmetic of a token is the same whether it runs alone
 * (decode) or inside a verify block or prefill chunk. A block is one warp of 32 columns of
 * one value head (qwen35: 48 heads x 4 = 192 blocks); q and k of the current token are
 * staged in shared memory for the warp. The state stays f32 in memory between calls. */
#include "kernels/cuda/ops_dev.cuh"

#define DELTA_COLS 32   /* columns (threads) per block */
#define DELTA_MAX_DK 128 /* column held in registers */

__global__ void __launch_bounds__(DELTA_COLS) delta_kernel(ops_delta d)
{
    __shared__ float qs[DELTA_MAX_DK], ks[DELTA_MAX_DK];
    const int64_t dk = d.d_k, dv = d.d_v, nv = d.n_v_head;
    const int64_t h = blockIdx.y, kh = h % d.n_k_head;
    const int64_t j = (int64_t)blockIdx.x * DELTA_COLS + threadIdx.x;
    const bool live = j < dv;
    float *S = d.state + h * dk * dv + j; /* S[i][j] at S[i * dv] */
    const int64_t gbs = d.gb_tok_stride ? d.gb_tok_stride : nv;
    float s[DELTA_MAX_DK];
#pragma unroll
    for (int i = 0; i < DELTA_MAX_DK; i++)
        s[i] = live && i < dk ? S[i * dv] : 0.0f;
    if (live && d.state_prev) {
        float *P = d.state_prev + h * dk * dv + j;
#pragma unroll
        for (int i = 0; i < DELTA_MAX_DK; i++)
            if (i < dk)
                P[i * dv] = s[i];
    }
    for (int64_t t = 0; t < d.n_tok; t++) {
        const float *q = d.q + t * d.q_tok_stride + kh * dk;
        const float *k = d.k + t * d.k_tok_stride + kh * dk;
        __syncthreads(); /* the previous token is done with qs, ks */
        for (int64_t i = threadIdx.x; i < dk; i += DELTA_COLS) {
            qs[i] = q[i];
            ks[i] = k[i];
        }
        __syncthreads();
        if (!live)
            continue;
        const float decay = expf(d.g[t * gbs + h]);
        const float beta = d.beta[t * gbs + h];
        /* S = exp(g) S and kv = S^T k in one sweep, as the CPU */
        float kv = 0;
#pragma unroll
        for (int i = 0; i < DELTA_MAX_DK; i++)
            if (i < dk) {
                s[i] *= decay;
                kv = fmaf(s[i], ks[i], kv);
            }
        const float u = beta * (d.v[t * d.v_tok_stride + h * dv + j] - kv);
        /* S += k (x) u, then o = S^T q */
        float o = 0;
#pragma unroll
        for (int i = 0; i < DELTA_MAX_DK; i++)
            if (i < dk) {
                s[i] = fmaf(ks[i], u, s[i]);
                o = fmaf(s[i], qs[i], o);
            }
        d.out[(t * nv + h) * dv + j] = o;
        if (d.state_all) {
            float *sa = d.state_all + (t * nv + h) * dk * dv + j;
#pragma unroll
            for (int i = 0; i < DELTA_MAX_DK; i++)
                if (i < dk)
                    sa[i * dv] = s[i];
        }
    }
    if (live) {
#pragma unroll
        for (int i = 0; i < DELTA_MAX_DK; i++)
            if (i < dk)
                S[i * dv] = s[i];
    }
}

extern "C" td_err cuda_delta_rule(const ops_delta *d, ops_stream st)
{
    TD_ASSERT(d != NULL && d->q && d->k && d->v && d->g && d->beta && d->state && d->out);
    TD_ASSERT(d->n_k_head >= 1 && d->n_v_head % d->n_k_head == 0);
    TD_ASSERT(d->d_k >= 1 && d->d_v >= 1 && d->n_tok >= 0);
    if (d->d_k > DELTA_MAX_DK)
        return err_set(TD_ENOTSUP, "delta rule with d_k %lld: the GPU handles up to %d",
                       (long long)d->d_k, DELTA_MAX_DK);
    if (d->n_v_head > 65535 || d->d_v / DELTA_COLS >= INT32_MAX)
        return err_set(TD_ENOTSUP, "delta rule with %lld value heads of %lld",
                       (long long)d->n_v_head, (long long)d->d_v);
    if (d->n_v_head == 0 || (d->n_tok == 0 && !d->state_prev))
        return TD_OK;
    dim3 grid(cuda_blocks(d->d_v, DELTA_COLS), (unsigned)d->n_v_head);
    delta_kernel<<<grid, DELTA_COLS, 0, st>>>(*d);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}
