/* The sampler: logits -> the exact filtered distribution p (lossless speculative sampling
 * compares draft and target through it) and a reproducible draw from p.
 *
 * The draw uses a counter-based RNG (Philox4x32-10): the number for (seed, step) does not
 * depend on what was drawn before, so a verifier, a restarted process and the CUDA side all
 * reproduce the same token.
 *
 * Also the log probabilities a client may ask for with each token (cpu_logprob_rows). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

/* --- Philox4x32-10 ---------------------------------------------------------------------- */

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* key schedule increments (golden ratio, sqrt(3) - 1) */
#define PHILOX_W1 0xBB67AE85u

void ops_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

double ops_rand_uniform(uint64_t seed, uint64_t counter)
{
    uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t o[4];
    ops_philox4x32(ctr, key, o);
    uint64_t bits = (((uint64_t)o[0] << 32) | o[1]) >> 11; /* 53 bits */
    return (double)bits * 0x1p-53;
}

int32_t cpu_sample_draw(const float *p, int64_t n_vocab, uint64_t seed, uint64_t step)
{
    TD_ASSERT(p != NULL && n_vocab >= 1 && n_vocab <= INT32_MAX);
    double total = 0;
    int64_t last = -1;
    for (int64_t i = 0; i < n_vocab; i++)
        if (p[i] > 0) {
            total += p[i];
            last = i;
        }
    TD_ASSERT(last >= 0); /* cpu_sample_probs always keeps a token */
    double target = ops_rand_uniform(seed, step) * total;
    double cum = 0;
    for (int64_t i = 0; i < n_vocab; i++) {
        if (!(p[i] > 0))
            continue;
        cum += p[i];
        if (cum > target)
            return (int32_t)i;
    }
    return (int32_t)last; /* rounding left target at the very top */
}

/* --- filtered distribution -------------------------------------------------------------- */

typedef struct cand {
    double e;  /* unnormalised probability exp((logit - max) / temperature) */
    int32_t i; /* token id */
} cand;

/* Most likely first, lower id first on ties (the order top-p walks). */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->e != y->e)
        return x->e > y->e ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* exp((l - max) / temperature); 1 for the max itself (also when it is +inf), 0 for NaN. */
static double cand_e(float l, float mx, double inv_t)
{
    if (l == mx)
        return 1.0;
    if (isnan(l))
        return 0.0;
    return exp(((double)l - mx) * inv_t);
}

static void one_hot(float *p, int64_t n, int64_t hot)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = 0;
    p[hot] = 1;
}

td_err cpu_sample_probs(float *p, const float *logits, int64_t n_vocab, const ops_sampler *s)
{
    TD_ASSERT(p != NULL && logits != NULL && s != NULL && n_vocab >= 1 && n_vocab <= INT32_MAX);
    if (!(s->temperature >= 0) || isinf(s->temperature))
        return err_set(TD_EINVAL, "temperature %g: must be finite and >= 0", s->temperature);
    if (!(s->top_p >= 0))
        return err_set(TD_EINVAL, "top_p %g: must be >= 0", s->top_p);
    if (!(s->min_p >= 0))
        return err_set(TD_EINVAL, "min_p %g: must be >= 0", s->min_p);

    int64_t best = cpu_argmax(logits, n_vocab);
    float mx = logits[best];
    if (isnan(mx) || mx == -INFINITY)
        return err_set(TD_EINVAL, "no finite logit among %lld", (long long)n_vocab);
    if (s->temperature == 0) {
        one_hot(p, n_vocab, best);
        return TD_OK;
    }

    const int use_k = s->top_k > 0 && s->top_k < n_vocab;
    const int use_p = s->top_p < 1;
    cand *c = malloc((size_t)n_vocab * sizeof *c);
    if (!c)
        return err_set(TD_ENOMEM, "sampler scratch for %lld tokens", (long long)n_vocab);

    /* c[0..n) = the candidates, sorted best first whenever top-k or top-p needs an order */
    int64_t n = 0;
    const double inv_t = 1.0 / (double)s->temperature;
    if (use_k) {
        int32_t *idx = malloc((size_t)s->top_k * sizeof *idx);
        if (!idx) {
            free(c);
            return err_set(TD_ENOMEM, "sampler scratch for top_k %d", s->top_k);
        }
        cpu_topk(idx, NULL, logits, n_vocab, s->top_k);
        for (int64_t j = 0; j < s->top_k; j++) {
            c[n].e = cand_e(logits[idx[j]], mx, inv_t);
            c[n].i = idx[j];
            n++;
        }
        free(idx);
    } else {
        for (int64_t i = 0; i < n_vocab; i++) {
            c[n].e = cand_e(logits[i], mx, inv_t);
            c[n].i = (int32_t)i;
            n++;
        }
    }
    double total = 0;
    for (int64_t j = 0; j < n; j++)
        total += c[j].e;

    if (use_p) {
        if (!use_k) {
            /* The kept set is a prefix of the sorted order: when the tokens at or above a
             * cut-off already hold top_p of the mass, only they need sorting. */
            static const double cuts[] = {1e-4, 1e-9, 0.0};
            double cut = 0;
            for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
                double mass = 0;
                for (int64_t j = 0; j < n; j++)
                    if (c[j].e >= cuts[k])
                        mass += c[j].e;
                cut = cuts[k];
                if (mass >= (double)s->top_p * total)
                    break;
            }
            int64_t m = 0;
            for (int64_t j = 0; j < n; j++)
                if (c[j].e >= cut && c[j].e > 0)
                    c[m++] = c[j];
            n = m;
            qsort(c, (size_t)n, sizeof *c, cand_cmp);
        }
        double cum = 0;
        int64_t keep = n;
        for (int64_t j = 0; j < n; j++) {
            cum += c[j].e;
            if (cum >= (double)s->top_p * total) {
                keep = j + 1;
                break;
            }
        }
        n = keep;
    }
    if (s->min_p > 0) {
        /* the best token has e = 1 and is always a candidate */
        int64_t m = 0;
        for (int64_t j = 0; j < n; j++)
            if (c[j].e >= (double)s->min_p || c[j].i == best)
                c[m++] = c[j];
        n = m;
    }

    double kept = 0;
    for (int64_t j = 0; j < n; j++)
        kept += c[j].e;
    for (int64_t i = 0; i < n_vocab; i++)
        p[i] = 0;
    for (int64_t j = 0; j < n; j++)
        p[c[j].i] = (float)(c[j].e / kept);
    free(c);
    return TD_OK;
}

td_err cpu_sample_rows(int32_t *tok, float *q, const float *logits, int64_t n, int64_t n_vocab,
                       const ops_sampler *s, uint64_t ctr, uint64_t ctr_step)
{
    TD_ASSERT(tok != NULL && q != NULL && logits != NULL && n >= 0);
    for (int64_t i = 0; i < n; i++) {
        float *qi = q + i * n_vocab;
        TD_TRY(cpu_sample_probs(qi, logits + i * n_vocab, n_vocab, s));
        tok[i] = cpu_sample_draw(qi, n_vocab, s->seed, ctr + (uint64_t)i * ctr_step);
    }
    return TD_OK;
}

/* --- speculative acceptance ------------------------------------------------------------- */

td_err cpu_accept_sampled(int32_t *result, float *p, const float *logits, const float *q,
                          const int32_t *draft, int64_t n, int64_t n_vocab, const ops_sampler *s,
                          const ops_accept_rng *rng)
{
    TD_ASSERT(result != NULL && p != NULL && logits != NULL && s != NULL && rng != NULL);
    TD_ASSERT(n >= 1 && n_vocab >= 1 && n_vocab <= INT32_MAX);
    TD_ASSERT(n == 1 || (q != NULL && draft != NULL));
    const int64_t V = n_vocab;
    for (int64_t i = 1; i < n; i++) {
        float *pi = p + (i - 1) * V;
        const float *lg = logits + (i - 1) * V, *qi = q + (i - 1) * V;
        TD_TRY(cpu_sample_probs(pi, lg, V, s));
        const int32_t d = draft[i - 1];
        const double u = ops_rand_uniform(s->seed, rng->accept + (uint64_t)i * rng->step);
        if (d >= 0 && d < V && qi[d] > 0.0f && u * (double)qi[d] < (double)pi[d])
            continue;
        /* the residual max(p - q, 0) in place; f32 differences, as the GPU computes them */
        double sum = 0;
        for (int64_t j = 0; j < V; j++) {
            float r = pi[j] - qi[j];
            pi[j] = r > 0 ? r : 0;
            sum += pi[j];
        }
        if (sum <= 0)
            TD_TRY(cpu_sample_probs(pi, lg, V, s));
        result[0] = (int32_t)(i - 1);
        result[1] = cpu_sample_draw(pi, V, s->seed, rng->target + (uint64_t)i * rng->step);
        return TD_OK;
    }
    float *pl = p + (n - 1) * V;
    TD_TRY(cpu_sample_probs(pl, logits + (n - 1) * V, V, s));
    result[0] = (int32_t)(n - 1);
    result[1] = cpu_sample_draw(pl, V, s->seed, rng->target + (uint64_t)n * rng->step);
    return TD_OK;
}

/* --- sparse additions (logit bias, penalties) ---------------------------------------------- */

void cpu_logit_add(float *logits, int64_t n, int64_t n_vocab, const int32_t *off,
                   const ops_logit_add *add)
{
    TD_ASSERT(n >= 0 && n_vocab >= 1 && off && off[0] == 0 && (add || off[n] == 0));
    for (int64_t i = 0; i < n; i++) {
        TD_ASSERT(off[i + 1] >= off[i]);
        for (int32_t j = off[i]; j < off[i + 1]; j++) {
            TD_ASSERT(add[j].tok >= 0 && add[j].tok < n_vocab);
            float *l = &logits[i * n_vocab + add[j].tok];
            if (add[j].rep != 1.0f)
                *l = *l > 0 ? *l / add[j].rep : *l * add[j].rep;
            *l += add[j].delta;
        }
    }
}

void cpu_logit_mask(float *logits, int64_t n, int64_t n_vocab, const uint32_t *allow)
{
    TD_ASSERT(n >= 0 && n_vocab >= 1 && (allow || n == 0));
    const int64_t W = OPS_MASK_WORDS(n_vocab);
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < n_vocab; t++)
            if (!(allow[i * W + t / 32] >> (t % 32) & 1u))
                logits[i * n_vocab + t] = -INFINITY;
}

/* --- log probabilities ------------------------------------------------------------------ */

void cpu_logprob_rows(ops_logprob *out, const float *logits, const int32_t *tok, int64_t n,
                      int64_t n_vocab, int n_top)
{
    TD_ASSERT(out != NULL && logits != NULL && tok != NULL && n >= 0 && n_vocab >= 1);
    TD_ASSERT(n_top >= 0 && n_top <= OPS_TOP_LOGPROBS_MAX);
    if (n_top > n_vocab)
        n_top = (int)n_vocab;
    for (int64_t r = 0; r < n; r++) {
        const float *x = logits + r * n_vocab;
        ops_logprob *o = &out[r];
        const double mx = x[cpu_argmax(x, n_vocab)];
        double sum = 0;
        for (int64_t i = 0; i < n_vocab; i++)
            sum += exp((double)x[i] - mx);
        const double lse = mx + log(sum);
        memset(o, 0, sizeof *o);
        o->logprob = tok[r] >= 0 && tok[r] < n_vocab ? (float)fmin(0.0, (double)x[tok[r]] - lse)
                                                     : -INFINITY;
        if (tok[r] >= 0 && tok[r] < n_vocab)
            for (int64_t i = 0; i < n_vocab; i++)
                o->rank += x[i] >= x[tok[r]];
        if (n_top == 0)
            continue;
        float val[OPS_TOP_LOGPROBS_MAX];
        cpu_topk(o->top_id, val, x, n_vocab, n_top);
        for (int j = 0; j < n_top; j++)
            o->top_logprob[j] = (float)fmin(0.0, (double)val[j] - lse);
        o->n_top = n_top;
    }
}
