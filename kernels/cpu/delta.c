/* Gated delta rule recurrence (Gated DeltaNet, DESIGN section 5), token by token. Value
 * heads are independent, so they are split across threads; S rows are d_v contiguous
 * floats, so every inner loop runs along contiguous memory. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

#define DELTA_MAX_DV 1024 /* largest d_v (stack scratch) */

/* The chunked form for value head h over tokens [a, a + c) (c <= OPS_DELTA_CHUNK_MAX):
 * S [d_k][d_v] holds the state before the chunk and ends as the state after it. With
 * G_t = g_a + ... + g_(a+t), the decay from the chunk's start through its token t, the
 * recurrence unrolls to
 *   S_t = e^G_t S + sum_(s<=t) e^(G_t - G_s) k_s u_s^T,
 *   u_t = beta_t (v_t - e^G_t S^T k_t - sum_(s<t) e^(G_t - G_s) (k_t . k_s) u_s),
 *   o_t = e^G_t S^T q_t + sum_(s<=t) e^(G_t - G_s) (q_t . k_s) u_s:
 * a forward substitution gives the u_t in order, each token's output follows from the u_s
 * before it, and the state at the chunk's end from all of them. */
static void delta_chunk_head(const ops_delta *d, int64_t h, float *S, int64_t a, int64_t c)
{
    const int64_t dk = d->d_k, dv = d->d_v, nv = d->n_v_head, kh = h % d->n_k_head;
    const int64_t gbs = d->gb_tok_stride ? d->gb_tok_stride : nv;
    TD_ASSERT(c >= 1 && c <= OPS_DELTA_CHUNK_MAX);
    float G[OPS_DELTA_CHUNK_MAX] = {0}, U[OPS_DELTA_CHUNK_MAX][OPS_DELTA_CHUNK_DV];
    float sum = 0;
    for (int64_t t = 0; t < c; t++)
        G[t] = sum += d->g[(a + t) * gbs + h];
    const float *k0 = d->k + a * d->k_tok_stride + kh * dk; /* token s's key: k0 + s * kst */
    const int64_t kst = d->k_tok_stride;
    for (int64_t t = 0; t < c; t++) {
        const float *k = k0 + t * kst;
        const float *q = d->q + (a + t) * d->q_tok_stride + kh * dk;
        const float *v = d->v + (a + t) * d->v_tok_stride + h * dv;
        const float eg = expf(G[t]), beta = d->beta[(a + t) * gbs + h];
        float *u = U[t], o[OPS_DELTA_CHUNK_DV];
        for (int64_t j = 0; j < dv; j++)
            u[j] = o[j] = 0;
        for (int64_t i = 0; i < dk; i++)
            for (int64_t j = 0; j < dv; j++) {
                u[j] += S[i * dv + j] * k[i];
                o[j] += S[i * dv + j] * q[i];
            }
        for (int64_t j = 0; j < dv; j++)
            u[j] = beta * (v[j] - eg * u[j]);
        for (int64_t s = 0; s < t; s++) {
            const float w = beta * expf(G[t] - G[s]) * cpu_dot_f32(k, k0 + s * kst, dk);
            for (int64_t j = 0; j < dv; j++)
                u[j] -= w * U[s][j];
        }
        if (!d->out)
            continue;
        float *out = d->out + ((a + t) * nv + h) * dv;
        for (int64_t j = 0; j < dv; j++)
            out[j] = eg * o[j];
        for (int64_t s = 0; s <= t; s++) {
            const float w = expf(G[t] - G[s]) * cpu_dot_f32(q, k0 + s * kst, dk);
            for (int64_t j = 0; j < dv; j++)
                out[j] += w * U[s][j];
        }
    }
    const float eg = expf(G[c - 1]);
    for (int64_t i = 0; i < dk * dv; i++)
        S[i] *= eg;
    for (int64_t s = 0; s < c; s++) {
        const float w = expf(G[c - 1] - G[s]);
        const float *k = k0 + s * kst;
        for (int64_t i = 0; i < dk; i++) {
            const float ki = w * k[i];
            for (int64_t j = 0; j < dv; j++)
                S[i * dv + j] += ki * U[s][j];
        }
    }
}

void cpu_delta_rule(const ops_delta *d)
{
    TD_ASSERT(d != NULL && d->q && d->k && d->v && d->g && d->beta && d->state);
    TD_ASSERT(d->n_k_head >= 1 && d->n_v_head % d->n_k_head == 0);
    TD_ASSERT(d->d_k >= 1 && d->d_v >= 1 && d->d_v <= DELTA_MAX_DV && d->n_tok >= 0);
    TD_ASSERT(!d->norm_z || d->out);
    TD_ASSERT(d->chunk >= 0 && d->chunk <= OPS_DELTA_CHUNK_MAX);
    TD_ASSERT(!d->chunk || (!d->state_all && d->d_k <= OPS_DELTA_CHUNK_DK &&
                            d->d_v <= OPS_DELTA_CHUNK_DV));
    const int64_t dk = d->d_k, dv = d->d_v, nv = d->n_v_head;
    const int64_t gbs = d->gb_tok_stride ? d->gb_tok_stride : nv;
    const int64_t p0 = d->pos0 ? *d->pos0 : 0;

#pragma omp parallel for schedule(static) if (d->n_tok * nv * dk * dv >= (1 << 16))
    for (int64_t h = 0; h < nv; h++) {
        float *S = d->state + h * dk * dv; /* [d_k][d_v] */
        const int64_t kh = h % d->n_k_head;
        float u[DELTA_MAX_DV];
        if (d->state_in)
            memcpy(S, d->state_in + h * dk * dv, (size_t)(dk * dv) * sizeof(float));
        if (d->state_prev)
            memcpy(d->state_prev + h * dk * dv, S, (size_t)(dk * dv) * sizeof(float));
        /* chunked: each chunk ends where the absolute position is a multiple of chunk */
        for (int64_t a = 0, c; d->chunk && a < d->n_tok; a += c) {
            c = d->chunk - (p0 + a) % d->chunk;
            delta_chunk_head(d, h, S, a, c < d->n_tok - a ? c : d->n_tok - a);
        }
        for (int64_t t = 0; !d->chunk && t < d->n_tok; t++) {
            const float *q = d->q + t * d->q_tok_stride + kh * dk;
            const float *k = d->k + t * d->k_tok_stride + kh * dk;
            const float *v = d->v + t * d->v_tok_stride + h * dv;
            const float decay = expf(d->g[t * gbs + h]);
            const float beta = d->beta[t * gbs + h];

            /* S = exp(g) S and kv = S^T k in one sweep */
            for (int64_t j = 0; j < dv; j++)
                u[j] = 0;
            for (int64_t i = 0; i < dk; i++) {
                float *Si = S + i * dv;
                for (int64_t j = 0; j < dv; j++) {
                    Si[j] *= decay;
                    u[j] += Si[j] * k[i];
                }
            }
            for (int64_t j = 0; j < dv; j++)
                u[j] = beta * (v[j] - u[j]);
            /* S += k (x) u, then o = S^T q (not wanted: the state alone) */
            float *o = d->out ? d->out + (t * nv + h) * dv : NULL;
            for (int64_t j = 0; o && j < dv; j++)
                o[j] = 0;
            for (int64_t i = 0; i < dk; i++) {
                float *Si = S + i * dv;
                for (int64_t j = 0; j < dv; j++)
                    Si[j] += k[i] * u[j];
                for (int64_t j = 0; o && j < dv; j++)
                    o[j] += Si[j] * q[i];
            }
            if (d->state_all)
                memcpy(d->state_all + (t * nv + h) * dk * dv, S, (size_t)(dk * dv) * sizeof(float));
        }
    }
    if (d->norm_z)
        cpu_rmsnorm_silu(d->out, d->out, d->norm_w, d->norm_z, d->n_tok * nv, dv, d->norm_eps);
}

void cpu_delta_rule_many(const ops_delta *d, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        cpu_delta_rule(&d[i]);
}
