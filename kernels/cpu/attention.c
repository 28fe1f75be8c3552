/* Attention over a K/V cache with position-based masks (causal, bidirectional, sliding
 * window, tree ancestors), GQA and an optional sigmoid output gate.
 *
 * Keys are visited in chunks of ATT_CHUNK with an online softmax (running max and sum), so
 * no scratch memory is needed for any context length; the value sum is kept in f64. */
#include <math.h>
#include <stdlib.h>

#include "kernels/ops.h"

#define ATT_CHUNK 128     /* keys scored per chunk */
#define ATT_MAX_DIM 1024  /* largest head_dim (stack accumulators) */

static float kv_load(const void *base, td_dtype type, int64_t i)
{
    if (type == TD_F16)
        return ops_f16_to_f32(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

static float dot_q_k(const float *q, const void *k, td_dtype type, int64_t off, int64_t n)
{
    float s = 0;
    if (type == TD_F16) {
        const uint16_t *kh = (const uint16_t *)k + off;
        for (int64_t i = 0; i < n; i++)
            s += q[i] * ops_f16_to_f32(kh[i]);
    } else {
        const float *kf = (const float *)k + off;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; i++)
            s += q[i] * kf[i];
    }
    return s;
}

/* Whether query t (at position qp) sees key i. */
static int key_visible(const ops_attn *a, int64_t t, int32_t qp, int64_t i)
{
    int64_t kp = a->k_pos[i];
    int64_t d = (int64_t)qp - kp;
    switch (a->mask) {
    case OPS_MASK_BIDIRECTIONAL:
        return a->window <= 0 || llabs(d) < a->window;
    case OPS_MASK_TREE: {
        int64_t first = a->n_kv - a->n_tree;
        if (i >= first) {
            int64_t j = i - first;
            int64_t words = (a->n_tree + 63) / 64;
            if (!((a->tree_bits[t * words + j / 64] >> (j % 64)) & 1))
                return 0;
            return a->window <= 0 || d < a->window;
        }
        break; /* context key: causal */
    }
    case OPS_MASK_CAUSAL:
        break;
    }
    return d >= 0 && (a->window <= 0 || d < a->window);
}

static float sigmoidf_(float x)
{
    float e = expf(-fabsf(x));
    return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

void cpu_attention(const ops_attn *a)
{
    TD_ASSERT(a != NULL && a->q != NULL && a->k != NULL && a->v != NULL && a->out != NULL);
    TD_ASSERT(a->q_pos != NULL && (a->n_kv == 0 || a->k_pos != NULL));
    TD_ASSERT(a->n_head >= 1 && a->n_head_kv >= 1 && a->n_head % a->n_head_kv == 0);
    TD_ASSERT(a->head_dim >= 1 && a->head_dim <= ATT_MAX_DIM);
    TD_ASSERT(a->kv_type == TD_F32 || a->kv_type == TD_F16);
    TD_ASSERT(a->mask != OPS_MASK_TREE ||
              (a->tree_bits != NULL && a->n_tree >= 0 && a->n_tree <= a->n_kv));
    const int64_t group = a->n_head / a->n_head_kv;
    const int64_t D = a->head_dim;

#pragma omp parallel for collapse(2) schedule(dynamic, 1)                                   \
    if (a->n_q * a->n_head * a->n_kv * D >= (1 << 16))
    for (int64_t t = 0; t < a->n_q; t++) {
        for (int64_t h = 0; h < a->n_head; h++) {
            const float *q = a->q + t * a->q_tok_stride + h * a->q_head_stride;
            const int64_t g = h / group;
            const int32_t qp = a->q_pos[t];
            double acc[ATT_MAX_DIM];
            float sc[ATT_CHUNK];
            for (int64_t d = 0; d < D; d++)
                acc[d] = 0;
            float m = -INFINITY; /* running max of the scores seen */
            double l = 0;        /* running sum of exp(score - m) */
            for (int64_t i0 = 0; i0 < a->n_kv; i0 += ATT_CHUNK) {
                int64_t n = a->n_kv - i0 < ATT_CHUNK ? a->n_kv - i0 : ATT_CHUNK;
                float cm = -INFINITY;
                for (int64_t c = 0; c < n; c++) {
                    int64_t i = i0 + c;
                    if (!key_visible(a, t, qp, i)) {
                        sc[c] = -INFINITY;
                        continue;
                    }
                    int64_t off = i * a->kv_tok_stride + g * a->kv_head_stride;
                    sc[c] = a->scale * dot_q_k(q, a->k, a->kv_type, off, D);
                    cm = fmaxf(cm, sc[c]);
                }
                if (cm == -INFINITY)
                    continue;
                float nm = fmaxf(m, cm);
                double corr = exp((double)m - (double)nm); /* 0 while m is -inf */
                l *= corr;
                for (int64_t d = 0; d < D; d++)
                    acc[d] *= corr;
                for (int64_t c = 0; c < n; c++) {
                    if (sc[c] == -INFINITY)
                        continue;
                    double p = exp((double)sc[c] - (double)nm);
                    l += p;
                    int64_t off = (i0 + c) * a->kv_tok_stride + g * a->kv_head_stride;
                    for (int64_t d = 0; d < D; d++)
                        acc[d] += p * kv_load(a->v, a->kv_type, off + d);
                }
                m = nm;
            }
            float *o = a->out + (t * a->n_head + h) * D;
            for (int64_t d = 0; d < D; d++)
                o[d] = l > 0 ? (float)(acc[d] / l) : 0.0f;
            if (a->gate) {
                const float *gt = a->gate + t * a->gate_tok_stride + h * a->gate_head_stride;
                for (int64_t d = 0; d < D; d++)
                    o[d] *= sigmoidf_(gt[d]);
            }
        }
    }
}
