/* Attention over a K/V cache with position-based masks (causal, bidirectional, sliding
 * window, tree ancestors), GQA and an optional sigmoid output gate.
 *
 * Keys are visited in chunks of ATT_CHUNK with an online softmax (running max and sum), so
 * no scratch memory is needed for any context length; the value sum is kept in f64. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

#define ATT_CHUNK 128     /* keys scored per chunk */
#define ATT_MAX_DIM 1024  /* largest head_dim (stack accumulators) */

/* Row off (in elements) of a K or V cache as f32: in place for F32, converted into buf
 * (head_dim values, F16C when the CPU has it) for F16. */
static const float *kv_row(const ops_attn *a, const void *base, int64_t off, float *buf)
{
    if (a->kv_type == TD_F32)
        return (const float *)base + off;
    td_err e = cpu_dequantize_row(TD_F16, (const uint16_t *)base + off, buf, a->head_dim);
    TD_ASSERT(e == TD_OK);
    return buf;
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
    TD_ASSERT(a->n_kv_dev == NULL || (a->mask != OPS_MASK_TREE && *a->n_kv_dev >= 0));
    const int64_t group = a->n_head / a->n_head_kv;
    const int64_t D = a->head_dim;
    const int64_t n_kv = a->n_kv_dev && *a->n_kv_dev < a->n_kv ? *a->n_kv_dev : a->n_kv;

#pragma omp parallel for collapse(2) schedule(dynamic, 1)                                   \
    if (a->n_q * a->n_head * n_kv * D >= (1 << 16))
    for (int64_t t = 0; t < a->n_q; t++) {
        for (int64_t h = 0; h < a->n_head; h++) {
            const float *q = a->q + t * a->q_tok_stride + h * a->q_head_stride;
            const int64_t g = h / group;
            const int32_t qp = a->q_pos[t];
            double acc[ATT_MAX_DIM];
            float sc[ATT_CHUNK];
            float row[ATT_MAX_DIM]; /* one f16 key or value row as f32 */
            for (int64_t d = 0; d < D; d++)
                acc[d] = 0;
            float m = -INFINITY; /* running max of the scores seen */
            double l = 0;        /* running sum of exp(score - m) */
            for (int64_t i0 = 0; i0 < n_kv; i0 += ATT_CHUNK) {
                int64_t n = n_kv - i0 < ATT_CHUNK ? n_kv - i0 : ATT_CHUNK;
                float cm = -INFINITY;
                for (int64_t c = 0; c < n; c++) {
                    int64_t i = i0 + c;
                    if (!key_visible(a, t, qp, i)) {
                        sc[c] = -INFINITY;
                        continue;
                    }
                    int64_t off = i * a->kv_tok_stride + g * a->kv_head_stride;
                    sc[c] = a->scale * cpu_dot_f32(q, kv_row(a, a->k, off, row), D);
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
                    const float *v = kv_row(a, a->v, off, row);
                    for (int64_t d = 0; d < D; d++)
                        acc[d] += p * v[d];
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
