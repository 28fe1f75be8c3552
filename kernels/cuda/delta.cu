/* Gated delta rule, token by token (twin of kernels/cpu/delta.c).
 *
 * Every step of the recurrence works on columns of S independently: with S [d_k][d_v],
 * column j needs only S[:, j], k, q, v_j, g and beta (kv_j = sum_i S[i][j] k[i], then
 * S[:, j] += k u_j, o_j = sum_i S[i][j] q[i]). A block owns 32 columns of one value head
 * (qwen35: 48 heads x 4 = 192 blocks) and keeps them in registers for the whole sequence;
 * its DELTA_RG warps split the d_k rows of each column (warp w: rows w*32 .. w*32+31), so a
 * column's sums over i are DELTA_RG chains of 32 in order, added in warp order through
 * shared memory. That fixed order is the same whether a token runs alone (decode) or inside
 * a verify block or prefill chunk. Why warps over rows: one warp per 32 columns left a
 * decode step with 192 warps on the GPU and each token behind two 128-long dependent FMA
 * chains (the H200 profile: 32 us per layer for 6 MB of state traffic, 166 us for a 16-token
 * verify); four warps cut the chains to 32 and give four times the loads in flight.
 * The state stays f32 in memory between calls. */
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_dev.cuh"

#define DELTA_COLS 32    /* columns (lanes) per block */
#define DELTA_RG 4       /* warps per block, each over a quarter of the rows */
#define DELTA_MAX_DK 128 /* rows of a column held in registers across the warps */
#define DELTA_RS (DELTA_MAX_DK / DELTA_RG) /* rows per warp */

__global__ void __launch_bounds__(DELTA_COLS *DELTA_RG) delta_kernel(bool early, ops_delta d)
{
    pdl_enter(early);
    __shared__ float qs[DELTA_MAX_DK], ks[DELTA_MAX_DK];
    __shared__ float red[DELTA_RG][DELTA_COLS]; /* per-warp partial sums of the columns */
    const int64_t dk = d.d_k, dv = d.d_v, nv = d.n_v_head;
    const int64_t gbs = d.gb_tok_stride ? d.gb_tok_stride : nv;
    const int64_t h = blockIdx.y, kh = h % d.n_k_head;
    const int lane = threadIdx.x % DELTA_COLS, w = threadIdx.x / DELTA_COLS;
    const int64_t j = (int64_t)blockIdx.x * DELTA_COLS + lane;
    const int i0 = w * DELTA_RS; /* this warp's first row */
    const bool live = j < dv;
    float *S = d.state + h * dk * dv + j; /* S[i][j] at S[i * dv] */
    const float *S0 = (d.state_in ? d.state_in : d.state) + h * dk * dv + j;
    float s[DELTA_RS];
#pragma unroll
    for (int r = 0; r < DELTA_RS; r++)
        s[r] = live && i0 + r < dk ? S0[(int64_t)(i0 + r) * dv] : 0.0f;
    if (live && d.state_prev) {
        float *P = d.state_prev + h * dk * dv + j;
#pragma unroll
        for (int r = 0; r < DELTA_RS; r++)
            if (i0 + r < dk)
                P[(int64_t)(i0 + r) * dv] = s[r];
    }
    for (int64_t t = 0; t < d.n_tok; t++) {
        const float *q = d.q + t * d.q_tok_stride + kh * dk;
        const float *k = d.k + t * d.k_tok_stride + kh * dk;
        __syncthreads(); /* the previous token is done with qs, ks and red */
        for (int64_t i = threadIdx.x; i < dk; i += DELTA_COLS * DELTA_RG) {
            qs[i] = q[i];
            ks[i] = k[i];
        }
        __syncthreads();
        const float decay = expf(d.g[t * gbs + h]);
        const float beta = d.beta[t * gbs + h];
        /* S = exp(g) S and this warp's part of kv = S^T k in one sweep */
        float kv = 0;
#pragma unroll
        for (int r = 0; r < DELTA_RS; r++)
            if (i0 + r < dk) {
                s[r] *= decay;
                kv = fmaf(s[r], ks[i0 + r], kv);
            }
        red[w][lane] = kv;
        __syncthreads();
        kv = red[0][lane];
#pragma unroll
        for (int g = 1; g < DELTA_RG; g++)
            kv += red[g][lane];
        const float vj = live ? d.v[t * d.v_tok_stride + h * dv + j] : 0.0f;
        const float u = beta * (vj - kv);
        /* S += k (x) u, then this warp's part of o = S^T q */
        float o = 0;
#pragma unroll
        for (int r = 0; r < DELTA_RS; r++)
            if (i0 + r < dk) {
                s[r] = fmaf(ks[i0 + r], u, s[r]);
                o = fmaf(s[r], qs[i0 + r], o);
            }
        __syncthreads(); /* every warp has read red */
        red[w][lane] = o;
        __syncthreads();
        if (w == 0 && live) {
            float sum = red[0][lane];
#pragma unroll
            for (int g = 1; g < DELTA_RG; g++)
                sum += red[g][lane];
            d.out[(t * nv + h) * dv + j] = sum;
        }
        if (live && d.state_all) {
            float *sa = d.state_all + (t * nv + h) * dk * dv + j;
#pragma unroll
            for (int r = 0; r < DELTA_RS; r++)
                if (i0 + r < dk)
                    sa[(int64_t)(i0 + r) * dv] = s[r];
        }
    }
    if (live) {
#pragma unroll
        for (int r = 0; r < DELTA_RS; r++)
            if (i0 + r < dk)
                S[(int64_t)(i0 + r) * dv] = s[r];
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
    if (d->n_v_head == 0 || (d->n_tok == 0 && !d->state_prev && !d->state_in))
        return TD_OK;
    dim3 grid(cuda_blocks(d->d_v, DELTA_COLS), (unsigned)d->n_v_head);
    return pdl_launch<delta_kernel>("delta rule", grid, dim3(DELTA_COLS * DELTA_RG), 0, st, *d);
}
