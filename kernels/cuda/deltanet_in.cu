/* Gated DeltaNet's recurrence inputs in one launch (twin of cpu_deltanet_in): what the F32
 * matmul of ssm_alpha and ssm_beta, conv1d_silu and delta_prep did as three launches, 48 of
 * each per 27B step. Each part is computed exactly as in its own kernel, so the bits are the
 * three launches' bits:
 *  - alpha/beta blocks are the F32 matmul's CTAs (matmul_float.cuh: the same loads, order and
 *    reduction), storing g = softplus(alpha + dt_bias) * ssm_a and beta' = sigmoid(beta) in
 *    place of the raw projections, with delta_prep's expressions;
 *  - every other block owns 128 channels (one per thread) for a contiguous group of tokens:
 *    the conv sum of each (token, channel) in conv_kernel's order and roundings, SiLU, and
 *    for a q or k head (d_k <= 128) the L2 norm through delta_prep's block of 128 threads
 *    (the same sum tree), q scaled after. A thread keeps its channel's window in registers.
 *    A block of n tokens is cut into up to DNI_GROUPS groups of >= 3 tokens, so each head's
 *    chain of block sums is n / groups long; group 0 alone reads the carried window (the
 *    others start from the raw inputs before their tokens), keeps it in conv_prev where asked
 *    (a rollback point) and writes the new one, the last 3 raw inputs, at its end: no other
 *    block touches the channel's state.
 * The tokens' inputs are loaded DNI_TB at a time ahead of their sums, so a group waits one
 * round trip per DNI_TB tokens, not one per token. */
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_float.cuh"
#include "kernels/cuda/ops_dev.cuh"
extern "C" {
#include "kernels/cuda_mem.h"
}

#define DNI_THREADS 128 /* a block: the F32 matmul's CTA, delta_prep's head of d_k <= 128 */
#define DNI_K 4         /* conv taps of the one-launch path */
#define DNI_TB 8        /* tokens whose inputs are loaded together */
#define DNI_GROUPS 8    /* most token groups per channel block */
static_assert(DNI_THREADS == mmf::KSPLIT * 32, "the F32 CTA's threads");

struct dni_args {
    mm_set ab;            /* member 0: ssm_alpha, member 1: ssm_beta (F32, one shape) */
    size_t row_bytes;     /* of their rows */
    int64_t cols;         /* their inputs */
    const float *h;       /* [n_tok][cols] */
    bool vec;             /* 16-byte loads for the F32 part */
    int n_ttiles;         /* token tiles of the F32 part */
    const float *raw;     /* token t at raw + t * raw_stride, [n_ch] */
    int64_t raw_stride;
    const float *conv_w;  /* [n_ch][DNI_K] */
    float *state;         /* [DNI_K - 1][n_ch] */
    float *prev;          /* NULL, or [DNI_K - 1][n_ch]: the state before the first token */
    int64_t n_ch;
    float *qkv;           /* [n_tok][n_ch] */
    float *gb;            /* [n_tok][2][nv] */
    const float *dt_bias, *ssm_a; /* [nv] */
    int nv, nk, dk, n_tok;
    int groups;              /* token groups per channel block (each >= DNI_K - 1 tokens) */
    int qk_blocks, v_blocks; /* 2 * nk head blocks, then the value channels' blocks, each
                              * times groups */
    float eps, q_scale;
    bool early; /* one token (TT 1): weights read before pdl_enter (pdl_early_reads) */
};

/* The channel of thread tid of channel block b (b < qk_blocks + v_blocks) and whether it
 * exists; channel block *cb. */
__device__ __forceinline__ int64_t dni_channel(const dni_args &a, int b, int tid, int *cb,
                                               bool *live)
{
    const bool head = b < a.qk_blocks;
    *cb = (head ? b : b - a.qk_blocks) / a.groups;
    const int64_t c = head ? (int64_t)*cb * a.dk + tid
                           : 2 * (int64_t)a.nk * a.dk + (int64_t)*cb * DNI_THREADS + tid;
    *live = head ? tid < a.dk : c < a.n_ch;
    return c;
}

template <int TT> __global__ void __launch_bounds__(DNI_THREADS) dni_kernel(bool early, dni_args a)
{
    /* One token (a decode step): the weights are read while the kernel before still runs, the
     * conv taps into registers and the F32 rows into L2. Blocks of tokens keep them after the
     * wait (a 16-token verify measured slower with the early reads compiled in, H100). */
    float wc[DNI_K]; /* taps */
    bool have_taps = false;
    if constexpr (TT == 1) {
        const int b = (int)blockIdx.x, tid = (int)threadIdx.x;
        if (a.early && b >= a.qk_blocks + a.v_blocks) {
            const int f = b - a.qk_blocks - a.v_blocks;
            mmf::prefetch_rows(a.ab, f / a.n_ttiles, a.row_bytes);
        } else if (a.early) {
            int cb;
            bool live;
            const int64_t c = dni_channel(a, b, tid, &cb, &live);
#pragma unroll
            for (int i = 0; i < DNI_K; i++)
                wc[i] = live ? a.conv_w[c * DNI_K + i] : 0.0f;
            have_taps = true;
        }
    }
    pdl_enter(early);
    __shared__ mmf::cta_red<TT> red;
    __shared__ double sh[33];
    const int b = (int)blockIdx.x, tid = (int)threadIdx.x;
    if (b >= a.qk_blocks + a.v_blocks) { /* alpha and beta rows, stored as their gates */
        const int f = b - a.qk_blocks - a.v_blocks;
        mmf::cta<TT>(a.ab, f / a.n_ttiles, (f % a.n_ttiles) * TT, a.row_bytes, a.cols, a.h,
                     a.n_tok, a.vec, red, [&](int m, int64_t row, int tok, float v) {
                         float *g = a.gb + (int64_t)tok * 2 * a.nv;
                         if (m == 0)
                             g[row] = __fmul_rn(dev_softplus(__fadd_rn(v, a.dt_bias[row])),
                                                a.ssm_a[row]);
                         else
                             g[a.nv + row] = dev_sigmoid(v);
                     });
        return;
    }
    /* channel block cb, token group g: tokens [t_begin, t_end) */
    int cb;
    bool live;
    const int64_t c = dni_channel(a, b, tid, &cb, &live);
    const int g = b % a.groups;
    const bool head = b < a.qk_blocks, is_q = head && cb < a.nk;
    const int t_begin = g * a.n_tok / a.groups, t_end = (g + 1) * a.n_tok / a.groups;
    float win[DNI_K - 1]; /* raw inputs of the last DNI_K - 1 times, oldest first */
    if (!have_taps) {
#pragma unroll
        for (int i = 0; i < DNI_K; i++)
            wc[i] = live ? a.conv_w[c * DNI_K + i] : 0.0f;
    }
    /* group 0 starts from the carried window; the others (t_begin >= DNI_K - 1) from the
     * raw inputs before their first token, so only group 0 touches the state */
#pragma unroll
    for (int i = 0; i < DNI_K - 1; i++)
        win[i] = !live ? 0.0f
                 : g == 0 ? a.state[i * a.n_ch + c]
                          : a.raw[(int64_t)(t_begin - (DNI_K - 1) + i) * a.raw_stride + c];
    if (live && g == 0 && a.prev) {
#pragma unroll
        for (int i = 0; i < DNI_K - 1; i++)
            a.prev[i * a.n_ch + c] = win[i];
    }
    for (int t0 = t_begin; t0 < t_end; t0 += DNI_TB) {
        float in[DNI_TB];
#pragma unroll
        for (int j = 0; j < DNI_TB; j++)
            in[j] = live && t0 + j < t_end ? a.raw[(int64_t)(t0 + j) * a.raw_stride + c] : 0.0f;
#pragma unroll
        for (int j = 0; j < DNI_TB; j++) {
            if (t0 + j >= t_end) /* the same for every thread of the block */
                break;
            /* conv_kernel's sum: taps in order, tap DNI_K - 1 the current input */
            float s = 0;
#pragma unroll
            for (int i = 0; i < DNI_K - 1; i++)
                s = __fadd_rn(s, __fmul_rn(wc[i], win[i]));
            s = __fadd_rn(s, __fmul_rn(wc[DNI_K - 1], in[j]));
#pragma unroll
            for (int i = 0; i < DNI_K - 2; i++)
                win[i] = win[i + 1];
            win[DNI_K - 2] = in[j];
            float y = dev_silu(s);
            if (head) { /* delta_prep's L2 norm of the head, q scaled after */
                const float part = live ? fmaf(y, y, 0.0f) : 0.0f;
                const float inv = dev_l2_inv(dev_block_sum((double)part, sh), a.eps);
                y = __fmul_rn(y, inv);
                if (is_q)
                    y = __fmul_rn(y, a.q_scale);
            }
            if (live)
                a.qkv[(int64_t)(t0 + j) * a.n_ch + c] = y;
        }
    }
    if (live && g == 0) { /* the new window: the last DNI_K - 1 inputs of the block */
#pragma unroll
        for (int i = 0; i < DNI_K - 1; i++)
            a.state[i * a.n_ch + c] =
                a.groups == 1 ? win[i]
                              : a.raw[(int64_t)(a.n_tok - (DNI_K - 1) + i) * a.raw_stride + c];
    }
}

/* The three launches the kernel stands for. */
static td_err dni_apart(const ops_dn_in *p, ops_stream st)
{
    const ops_mm_out ab[] = {{p->alpha, p->w_alpha}, {p->beta, p->w_beta}};
    if (p->conv_prev && p->conv_k > 1)
        TD_TRY(cuda_mem_copy_chained(p->conv_prev, p->conv_state,
                                     (size_t)((p->conv_k - 1) * p->n_ch) * sizeof(float), st));
    TD_TRY(cuda_matmul_multi(p->h, ab, 2, p->n_tok, st));
    TD_TRY(cuda_conv1d_silu(p->qkv, p->conv_state, NULL, p->raw, p->raw_stride, p->conv_w,
                            p->n_tok, p->n_ch, p->conv_k, st));
    return cuda_delta_prep(p->gb, p->qkv, p->alpha, p->beta, p->dt_bias, p->ssm_a, p->n_tok,
                           p->n_v_head, p->n_k_head, p->d_k, p->n_ch, p->eps, st);
}

template <int TT> static td_err dni_launch(dni_args &a, ops_stream st)
{
    a.n_ttiles = (a.n_tok + TT - 1) / TT;
    a.early = TT == 1 && pdl_early_reads();
    const int64_t blocks = a.qk_blocks + a.v_blocks + a.ab.first[a.ab.n] * a.n_ttiles;
    return pdl_launch<dni_kernel<TT>>("deltanet_in", dim3((unsigned)blocks), dim3(DNI_THREADS), 0,
                                      st, a);
}

extern "C" td_err cuda_deltanet_in(const ops_dn_in *p, ops_stream st)
{
    TD_ASSERT(p != NULL && p->h && p->w_alpha && p->w_beta && p->raw && p->conv_w && p->qkv);
    TD_ASSERT(p->gb && p->dt_bias && p->ssm_a && p->n_tok >= 0 && p->conv_k >= 1);
    TD_ASSERT(p->n_k_head >= 1 && p->d_k >= 1 && p->n_v_head >= 1);
    TD_ASSERT(p->n_ch >= 2 * p->n_k_head * p->d_k && p->raw_stride >= p->n_ch);
    if (p->n_tok == 0)
        return TD_OK;
    const ops_weight *wa = p->w_alpha, *wb = p->w_beta;
    const bool one = p->conv_k == DNI_K && p->d_k <= DNI_THREADS && p->n_tok <= MM_CHUNK &&
                     wa->type == TD_F32 && wb->type == TD_F32 && wa->cols == wb->cols &&
                     wa->rows == p->n_v_head && wb->rows == p->n_v_head &&
                     wa->row_bytes == wb->row_bytes && p->n_ch / DNI_THREADS < 65536 &&
                     p->n_k_head < 32768;
    if (!one)
        return dni_apart(p, st);
    const ops_mm_out ab[] = {{p->alpha, wa}, {p->beta, wb}};
    dni_args a = {};
    a.ab = mm_set_of(ab, 2, mmf::RW);
    a.row_bytes = wa->row_bytes, a.cols = wa->cols, a.h = p->h, a.vec = mmf::vec_ok(ab, 2, p->h);
    a.raw = p->raw, a.raw_stride = p->raw_stride, a.conv_w = p->conv_w, a.state = p->conv_state;
    a.prev = p->conv_prev;
    a.n_ch = p->n_ch, a.qkv = p->qkv, a.gb = p->gb, a.dt_bias = p->dt_bias, a.ssm_a = p->ssm_a;
    a.nv = (int)p->n_v_head, a.nk = (int)p->n_k_head, a.dk = (int)p->d_k, a.n_tok = (int)p->n_tok;
    a.groups = a.n_tok / (DNI_K - 1) < DNI_GROUPS ? a.n_tok / (DNI_K - 1) : DNI_GROUPS;
    a.groups = a.groups < 1 ? 1 : a.groups;
    a.qk_blocks = 2 * a.nk * a.groups;
    a.v_blocks = (int)cuda_blocks(p->n_ch - 2 * p->n_k_head * p->d_k, DNI_THREADS) * a.groups;
    a.eps = p->eps, a.q_scale = 1.0f / sqrtf((float)p->d_k);
    /* two tokens per F32 CTA at most: the F32 matmul's 8 would leave a 16-token block's 96
     * rows to 48 CTAs of 8 tokens, the kernel's longest blocks (verify 16, profiled: 925 us of
     * deltanet_in per step with token groups and 8 tokens per CTA) */
    return a.n_tok == 1 ? dni_launch<1>(a, st) : dni_launch<2>(a, st);
}
