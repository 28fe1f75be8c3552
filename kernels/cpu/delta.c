/* Gated delta rule recurrence (Gated DeltaNet, DESIGN section 5), token by token. Value
 * heads are independent, so they are split across threads; S rows are d_v contiguous
 * floats, so every inner loop runs along contiguous memory. */
#include <math.h>
#include <string.h>

#include "kernels/ops.h"

#define DELTA_MAX_DV 1024 /* largest d_v (stack scratch) */

void cpu_delta_rule(const ops_delta *d)
{
    TD_ASSERT(d != NULL && d->q && d->k && d->v && d->g && d->beta && d->state);
    TD_ASSERT(d->n_k_head >= 1 && d->n_v_head % d->n_k_head == 0);
    TD_ASSERT(d->d_k >= 1 && d->d_v >= 1 && d->d_v <= DELTA_MAX_DV && d->n_tok >= 0);
    TD_ASSERT(!d->norm_z || d->out);
    const int64_t dk = d->d_k, dv = d->d_v, nv = d->n_v_head;
    const int64_t gbs = d->gb_tok_stride ? d->gb_tok_stride : nv;

#pragma omp parallel for schedule(static) if (d->n_tok * nv * dk * dv >= (1 << 16))
    for (int64_t h = 0; h < nv; h++) {
        float *S = d->state + h * dk * dv; /* [d_k][d_v] */
        const int64_t kh = h % d->n_k_head;
        float u[DELTA_MAX_DV];
        if (d->state_in)
            memcpy(S, d->state_in + h * dk * dv, (size_t)(dk * dv) * sizeof(float));
        if (d->state_prev)
            memcpy(d->state_prev + h * dk * dv, S, (size_t)(dk * dv) * sizeof(float));
        for (int64_t t = 0; t < d->n_tok; t++) {
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
