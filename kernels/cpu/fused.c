/* Fused chains of ops (kernels/ops.h): the same arithmetic as the chain, step by step (each
 * intermediate rounded to f32 where the chain stored it), so the result is bit for bit the
 * chain's. The point is the GPU twin: one launch and one pass over memory instead of several. */
#include <math.h>
#include <string.h>

#include "kernels/ops.h"

/* 1 / (1 + e^-x) as cpu_sigmoid. */
static float fused_sigmoid(float x)
{
    float e = expf(-fabsf(x));
    return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

void cpu_add_rmsnorm(float *x, const float *h, float *out, const float *w, int64_t n_rows,
                     int64_t dim, float eps)
{
    TD_ASSERT(x != NULL && h != NULL && out != NULL && out != x && n_rows >= 0 && dim >= 1);
    cpu_add(x, x, h, n_rows * dim);
    cpu_rmsnorm(out, x, w, n_rows, dim, dim, eps);
}

void cpu_rmsnorm_silu(float *out, const float *x, const float *w, const float *z,
                      int64_t n_rows, int64_t dim, float eps)
{
    TD_ASSERT(out != NULL && x != NULL && z != NULL && n_rows >= 0 && dim >= 1);
#pragma omp parallel for schedule(static) if (n_rows * dim >= (1 << 16))
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * dim, *zr = z + r * dim;
        float *o = out + r * dim;
        double ss = 0;
        for (int64_t i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        for (int64_t i = 0; i < dim; i++) {
            float n = w ? xr[i] * inv * w[i] : xr[i] * inv;
            float g = zr[i] * fused_sigmoid(zr[i]);
            o[i] = n * g;
        }
    }
}

void cpu_conv1d_silu(float *out, float *state, float *state_all, const float *x,
                     int64_t x_stride, const float *w, int64_t n_tok, int64_t n_ch, int64_t k)
{
    cpu_conv1d_causal(out, state, state_all, x, x_stride, w, n_tok, n_ch, k);
    cpu_silu(out, out, n_tok * n_ch);
}

void cpu_qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm,
                      int64_t n_tok, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                      int64_t q_head, int64_t n_rot, const int32_t *pos, float theta, float eps)
{
    TD_ASSERT((q != NULL || n_head == 0) && k != NULL && q_head >= head_dim && n_tok >= 0);
    if (n_head)
        cpu_rmsnorm(q, q, q_norm, n_tok * n_head, head_dim, q_head, eps);
    cpu_rmsnorm(k, k, k_norm, n_tok * n_head_kv, head_dim, head_dim, eps);
    if (n_head)
        cpu_rope_neox(q, n_tok, n_head, n_head * q_head, q_head, n_rot, pos, theta);
    cpu_rope_neox(k, n_tok, n_head_kv, n_head_kv * head_dim, head_dim, n_rot, pos, theta);
}

void cpu_swiglu_matmul(float *y, float *gate, const float *up, const ops_weight *w,
                       int64_t n_tok)
{
    TD_ASSERT(y != NULL && gate != NULL && up != NULL && w != NULL && n_tok >= 0);
    cpu_swiglu(gate, gate, up, n_tok * w->cols);
    cpu_matmul(y, gate, w, n_tok);
}

void cpu_delta_prep(float *gb, float *qkv, const float *alpha, const float *beta,
                    const float *dt_bias, const float *ssm_a, int64_t n_tok, int64_t n_v_head,
                    int64_t n_k_head, int64_t d_k, int64_t qkv_stride, float eps)
{
    TD_ASSERT(gb != NULL && qkv != NULL && alpha != NULL && beta != NULL);
    TD_ASSERT(dt_bias != NULL && ssm_a != NULL && n_tok >= 0 && n_v_head >= 1);
    TD_ASSERT(n_k_head >= 1 && d_k >= 1 && qkv_stride >= 2 * n_k_head * d_k);
    const int64_t nv = n_v_head, qk = n_k_head * d_k;
    const float q_scale = 1.0f / sqrtf((float)d_k);
    for (int64_t t = 0; t < n_tok; t++) {
        float *g = gb + t * 2 * nv, *b = g + nv, *row = qkv + t * qkv_stride;
        cpu_sigmoid(b, beta + t * nv, nv);
        cpu_add(g, alpha + t * nv, dt_bias, nv);
        cpu_softplus(g, g, nv);
        cpu_mul(g, g, ssm_a, nv);
        cpu_l2norm(row, row, 2 * n_k_head, d_k, d_k, eps);
        cpu_scale(row, row, q_scale, qk);
    }
}

void cpu_deltanet_in(const ops_dn_in *p)
{
    TD_ASSERT(p != NULL && p->w_alpha != NULL && p->w_beta != NULL && p->alpha && p->beta);
    cpu_matmul(p->alpha, p->h, p->w_alpha, p->n_tok);
    cpu_matmul(p->beta, p->h, p->w_beta, p->n_tok);
    if (p->conv_prev && p->conv_k > 1)
        memcpy(p->conv_prev, p->conv_state, (size_t)((p->conv_k - 1) * p->n_ch) * sizeof(float));
    cpu_conv1d_silu(p->qkv, p->conv_state, NULL, p->raw, p->raw_stride, p->conv_w, p->n_tok,
                    p->n_ch, p->conv_k);
    cpu_delta_prep(p->gb, p->qkv, p->alpha, p->beta, p->dt_bias, p->ssm_a, p->n_tok,
                   p->n_v_head, p->n_k_head, p->d_k, p->n_ch, p->eps);
}
