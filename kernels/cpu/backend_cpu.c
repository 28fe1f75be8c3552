/* The CPU backend: host memory and the cpu_* reference ops behind the backend table. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

static td_err be_cpu_alloc(const ops_backend *be, void **p, size_t bytes)
{
    (void)be;
    *p = malloc(bytes ? bytes : 1);
    return *p ? TD_OK : err_set(TD_ENOMEM, "out of host memory allocating %zu bytes", bytes);
}

static void be_cpu_release(const ops_backend *be, void *p)
{
    (void)be;
    free(p);
}

static td_err be_cpu_copy(const ops_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes)
        memmove(dst, src, bytes);
    return TD_OK;
}

static td_err be_cpu_copy2d(const ops_backend *be, void *dst, size_t dpitch, const void *src,
                            size_t spitch, size_t width, size_t rows)
{
    (void)be;
    for (size_t r = 0; r < rows && width; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return TD_OK;
}

static td_err be_cpu_zero(const ops_backend *be, void *p, size_t bytes)
{
    (void)be;
    memset(p, 0, bytes);
    return TD_OK;
}

static td_err be_cpu_sync(const ops_backend *be)
{
    (void)be;
    return TD_OK;
}

static td_err be_cpu_matmul(const ops_backend *be, float *y, const float *x, const ops_weight *w,
                            int64_t n_tok)
{
    (void)be;
    cpu_matmul(y, x, w, n_tok);
    return TD_OK;
}

/* Whether bytes at a and b overlap. */
static bool be_cpu_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    const uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

/* The CPU has nothing to share between the products: one cpu_matmul each. */
static td_err be_cpu_matmul_multi(const ops_backend *be, const float *x, const ops_mm_out *mm,
                                  int n, int64_t n_tok)
{
    (void)be;
    TD_ASSERT(x != NULL && mm != NULL && n >= 1 && n <= OPS_MM_GROUP_MAX && n_tok >= 1);
    const size_t x_bytes = (size_t)n_tok * (size_t)mm[0].w->cols * sizeof(float);
    /* the GPU rounds x once for the group, before any y is written: as separate products
     * only if no y lies in x or in another y */
    for (int i = 0; i < n; i++) {
        TD_ASSERT(mm[i].w != NULL && mm[i].w->cols == mm[0].w->cols);
        const size_t y_bytes = (size_t)n_tok * (size_t)mm[i].w->rows * sizeof(float);
        TD_ASSERT(!be_cpu_overlap(mm[i].y, y_bytes, x, x_bytes));
        for (int j = 0; j < i; j++)
            TD_ASSERT(!be_cpu_overlap(mm[i].y, y_bytes, mm[j].y,
                                      (size_t)n_tok * (size_t)mm[j].w->rows * sizeof(float)));
    }
    for (int i = 0; i < n; i++)
        cpu_matmul(mm[i].y, x, mm[i].w, n_tok);
    return TD_OK;
}

static td_err be_cpu_get_rows(const ops_backend *be, float *out, const ops_weight *w,
                              const int32_t *ids, int64_t n)
{
    (void)be;
    return cpu_get_rows(out, w, ids, n);
}

static td_err be_cpu_rmsnorm(const ops_backend *be, float *out, const float *x, const float *w,
                             int64_t n_rows, int64_t dim, int64_t stride, float eps)
{
    (void)be;
    cpu_rmsnorm(out, x, w, n_rows, dim, stride, eps);
    return TD_OK;
}

static td_err be_cpu_l2norm(const ops_backend *be, float *out, const float *x, int64_t n_rows,
                            int64_t dim, int64_t stride, float eps)
{
    (void)be;
    cpu_l2norm(out, x, n_rows, dim, stride, eps);
    return TD_OK;
}

/* Elementwise ops with one shape: out, a, b, n. */
#define BE_CPU_BINARY(name)                                                                  \
    static td_err be_cpu_##name(const ops_backend *be, float *out, const float *a,           \
                                const float *b, int64_t n)                                   \
    {                                                                                        \
        (void)be;                                                                            \
        cpu_##name(out, a, b, n);                                                            \
        return TD_OK;                                                                        \
    }
#define BE_CPU_UNARY(name)                                                                   \
    static td_err be_cpu_##name(const ops_backend *be, float *out, const float *x, int64_t n) \
    {                                                                                        \
        (void)be;                                                                            \
        cpu_##name(out, x, n);                                                               \
        return TD_OK;                                                                        \
    }
BE_CPU_BINARY(add)
BE_CPU_BINARY(mul)
BE_CPU_BINARY(swiglu)
BE_CPU_UNARY(silu)
BE_CPU_UNARY(sigmoid)
BE_CPU_UNARY(softplus)

static td_err be_cpu_scale(const ops_backend *be, float *out, const float *x, float s, int64_t n)
{
    (void)be;
    cpu_scale(out, x, s, n);
    return TD_OK;
}

static td_err be_cpu_rope_neox(const ops_backend *be, float *x, int64_t n_tok, int64_t n_head,
                               int64_t tok_stride, int64_t head_stride, int64_t n_rot,
                               const int32_t *pos, float theta)
{
    (void)be;
    cpu_rope_neox(x, n_tok, n_head, tok_stride, head_stride, n_rot, pos, theta);
    return TD_OK;
}

static td_err be_cpu_attention(const ops_backend *be, const ops_attn *a)
{
    (void)be;
    cpu_attention(a);
    return TD_OK;
}

static td_err be_cpu_conv1d_causal(const ops_backend *be, float *out, float *state,
                                   float *state_all, const float *x, int64_t x_stride,
                                   const float *w, int64_t n_tok, int64_t n_ch, int64_t k)
{
    (void)be;
    cpu_conv1d_causal(out, state, state_all, x, x_stride, w, n_tok, n_ch, k);
    return TD_OK;
}

static td_err be_cpu_swiglu_matmul(const ops_backend *be, float *y, float *gate,
                                   const float *up, const ops_weight *w, int64_t n_tok)
{
    (void)be;
    cpu_swiglu_matmul(y, gate, up, w, n_tok);
    return TD_OK;
}

static td_err be_cpu_qk_norm_rope(const ops_backend *be, float *q, float *k, const float *q_norm,
                                  const float *k_norm, int64_t n_tok, int64_t n_head,
                                  int64_t n_head_kv, int64_t head_dim, int64_t q_head,
                                  int64_t n_rot, const int32_t *pos, float theta, float eps,
                                  const ops_kv_dst *kv)
{
    (void)be;
    cpu_qk_norm_rope(q, k, q_norm, k_norm, n_tok, n_head, n_head_kv, head_dim, q_head, n_rot,
                     pos, theta, eps);
    if (kv)
        cpu_kv_store(kv->k_cache, kv->v_cache, kv->type, k, kv->v, kv->rows, n_tok, kv->row);
    if (kv && kv->qk_cache) {
        TD_ASSERT(n_head == n_head_kv && q_head == head_dim && kv->qv_cache && kv->qv);
        cpu_kv_store(kv->qk_cache, kv->qv_cache, kv->type, q, kv->qv, kv->rows, n_tok, kv->row);
    }
    return TD_OK;
}

static td_err be_cpu_delta_rule(const ops_backend *be, const ops_delta *d)
{
    (void)be;
    cpu_delta_rule(d);
    return TD_OK;
}

static td_err be_cpu_delta_rule_many(const ops_backend *be, const ops_delta *d, int64_t n)
{
    (void)be;
    cpu_delta_rule_many(d, n);
    return TD_OK;
}

static td_err be_cpu_to_f16(const ops_backend *be, uint16_t *out, const float *x, int64_t n)
{
    (void)be;
    cpu_to_f16(out, x, n);
    return TD_OK;
}

static td_err be_cpu_to_bf16(const ops_backend *be, uint16_t *out, const float *x, int64_t n)
{
    (void)be;
    cpu_to_bf16(out, x, n);
    return TD_OK;
}

static td_err be_cpu_from_bf16(const ops_backend *be, float *out, const uint16_t *x, int64_t n)
{
    (void)be;
    cpu_from_bf16(out, x, n);
    return TD_OK;
}

static td_err be_cpu_add_rmsnorm(const ops_backend *be, float *x, const float *h, float *out,
                                 const float *w, int64_t n_rows, int64_t dim, float eps)
{
    (void)be;
    cpu_add_rmsnorm(x, h, out, w, n_rows, dim, eps);
    return TD_OK;
}

static td_err be_cpu_deltanet_in(const ops_backend *be, const ops_dn_in *p)
{
    (void)be;
    cpu_deltanet_in(p);
    return TD_OK;
}

static td_err be_cpu_softcap(const ops_backend *be, float *out, const float *x, float cap,
                             int64_t n)
{
    (void)be;
    cpu_softcap(out, x, cap, n);
    return TD_OK;
}

static td_err be_cpu_argmax(const ops_backend *be, int32_t *idx, const float *x, int64_t n_rows,
                            int64_t n)
{
    (void)be;
    for (int64_t r = 0; r < n_rows; r++)
        idx[r] = (int32_t)cpu_argmax(x + r * n, n);
    return TD_OK;
}

static td_err be_cpu_accept_greedy(const ops_backend *be, int32_t *argmax, int32_t *result,
                                   const float *logits, const int32_t *draft, int64_t n,
                                   int64_t n_vocab)
{
    TD_ASSERT(n >= 1 && (n == 1 || draft != NULL));
    TD_TRY(be_cpu_argmax(be, argmax, logits, n, n_vocab));
    int64_t a = 0;
    while (a < n - 1 && draft[a] == argmax[a])
        a++;
    result[0] = (int32_t)a;
    result[1] = argmax[a];
    return TD_OK;
}

static td_err be_cpu_sample_rows(const ops_backend *be, int32_t *tok, float *q,
                                 const float *logits, int64_t n, int64_t n_vocab,
                                 const ops_sampler *s, uint64_t ctr, uint64_t ctr_step)
{
    (void)be;
    return cpu_sample_rows(tok, q, logits, n, n_vocab, s, ctr, ctr_step);
}

static td_err be_cpu_accept_sampled(const ops_backend *be, int32_t *result, float *p,
                                    const float *logits, const float *q, const int32_t *draft,
                                    int64_t n, int64_t n_vocab, const ops_sampler *s,
                                    const ops_accept_rng *rng)
{
    (void)be;
    return cpu_accept_sampled(result, p, logits, q, draft, n, n_vocab, s, rng);
}

static td_err be_cpu_logit_add(const ops_backend *be, float *logits, int64_t n, int64_t n_vocab,
                               const int32_t *off, const ops_logit_add *add)
{
    (void)be;
    cpu_logit_add(logits, n, n_vocab, off, add);
    return TD_OK;
}

static td_err be_cpu_logit_mask(const ops_backend *be, float *logits, int64_t n, int64_t n_vocab,
                                const uint32_t *allow)
{
    (void)be;
    cpu_logit_mask(logits, n, n_vocab, allow);
    return TD_OK;
}

static td_err be_cpu_logprob_rows(const ops_backend *be, ops_logprob *out, const float *logits,
                                  const int32_t *tok, int64_t n, int64_t n_vocab, int n_top)
{
    (void)be;
    cpu_logprob_rows(out, logits, tok, n, n_vocab, n_top);
    return TD_OK;
}

static const ops_backend be_cpu = {
    .kind = OPS_BACKEND_CPU,
    .name = "cpu",
    .stream = NULL,
    .device = -1,
    .delta_chunk_max = OPS_DELTA_CHUNK_MAX,
    .alloc = be_cpu_alloc,
    .release = be_cpu_release,
    .to_device = be_cpu_copy,
    .to_host = be_cpu_copy,
    .copy = be_cpu_copy,
    .copy2d = be_cpu_copy2d,
    .zero = be_cpu_zero,
    .sync = be_cpu_sync,
    .matmul = be_cpu_matmul,
    .matmul_multi = be_cpu_matmul_multi,
    .get_rows = be_cpu_get_rows,
    .rmsnorm = be_cpu_rmsnorm,
    .l2norm = be_cpu_l2norm,
    .add = be_cpu_add,
    .mul = be_cpu_mul,
    .scale = be_cpu_scale,
    .silu = be_cpu_silu,
    .sigmoid = be_cpu_sigmoid,
    .softplus = be_cpu_softplus,
    .swiglu = be_cpu_swiglu,
    .rope_neox = be_cpu_rope_neox,
    .attention = be_cpu_attention,
    .conv1d_causal = be_cpu_conv1d_causal,
    .delta_rule = be_cpu_delta_rule,
    .delta_rule_many = be_cpu_delta_rule_many,
    .to_f16 = be_cpu_to_f16,
    .to_bf16 = be_cpu_to_bf16,
    .from_bf16 = be_cpu_from_bf16,
    .add_rmsnorm = be_cpu_add_rmsnorm,
    .swiglu_matmul = be_cpu_swiglu_matmul,
    .qk_norm_rope = be_cpu_qk_norm_rope,
    .deltanet_in = be_cpu_deltanet_in,
    .softcap = be_cpu_softcap,
    .argmax = be_cpu_argmax,
    .accept_greedy = be_cpu_accept_greedy,
    .sample_rows = be_cpu_sample_rows,
    .accept_sampled = be_cpu_accept_sampled,
    .logprob_rows = be_cpu_logprob_rows,
    .logit_add = be_cpu_logit_add,
    .logit_mask = be_cpu_logit_mask,
};

const ops_backend *ops_backend_cpu(void)
{
    return &be_cpu;
}

td_err ops_backend_upload(const ops_backend *be, void **p, const void *src, size_t bytes)
{
    TD_TRY(be->alloc(be, p, bytes));
    td_err e = be->to_device(be, *p, src, bytes);
    if (e != TD_OK) {
        be->release(be, *p);
        *p = NULL;
    }
    return e;
}
