/* A generation's logit bias and penalties: sparse rows built on the host, added on the
 * backend (verifyd/penalty.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "verifyd/penalty.h"

static int pen_by_tok(const void *a, const void *b)
{
    const int32_t x = ((const ops_logit_add *)a)->tok, y = ((const ops_logit_add *)b)->tok;
    return (x > y) - (x < y);
}

td_err pen_init(pen_state *p, const pen_cfg *cfg, int64_t n_vocab)
{
    memset(p, 0, sizeof *p);
    TD_ASSERT(cfg && n_vocab >= 1 && n_vocab <= INT32_MAX && cfg->n_bias >= 0);
    TD_ASSERT(cfg->n_bias == 0 || (cfg->bias_tok && cfg->bias));
    TD_ASSERT(cfg->n_stop >= 0 && (cfg->n_stop == 0 || cfg->stop));
    if (!isfinite(cfg->presence) || !isfinite(cfg->frequency))
        return err_set(TD_EINVAL, "presence penalty %g / frequency penalty %g: not finite",
                       (double)cfg->presence, (double)cfg->frequency);
    if (!(cfg->repetition >= 0) || !isfinite(cfg->repetition))
        return err_set(TD_EINVAL, "repetition penalty %g: must be positive",
                       (double)cfg->repetition);
    if (cfg->min_tokens < 0)
        return err_set(TD_EINVAL, "min_tokens %d: negative", cfg->min_tokens);
    for (int32_t i = 0; i < cfg->n_bias; i++) {
        if (cfg->bias_tok[i] < 0 || cfg->bias_tok[i] >= n_vocab)
            return err_set(TD_EINVAL, "logit bias for token %d: outside the vocabulary of %lld",
                           cfg->bias_tok[i], (long long)n_vocab);
        if (!isfinite(cfg->bias[i]))
            return err_set(TD_EINVAL, "logit bias for token %d: %g is not finite",
                           cfg->bias_tok[i], (double)cfg->bias[i]);
    }
    p->presence = cfg->presence;
    p->frequency = cfg->frequency;
    p->rep = cfg->repetition == 0.0f ? 1.0f : cfg->repetition;
    p->n_vocab = n_vocab;
    const bool counted = cfg->presence != 0.0f || cfg->frequency != 0.0f || p->rep != 1.0f;
    const bool least = cfg->min_tokens > 0 && cfg->n_stop > 0;
    p->on = counted || cfg->n_bias > 0 || least || cfg->n_allowed > 0 || cfg->n_bad > 0;
    if (!p->on)
        return TD_OK;
    bool ok = true;
    if (cfg->n_bad > 0) {
        TD_ASSERT(cfg->bad);
        int32_t longest = 1;
        for (int32_t i = 0; i < cfg->n_bad; i += 1 + cfg->bad[i]) {
            const int32_t L = cfg->bad[i];
            if (L < 1 || L > cfg->n_bad - i - 1)
                return err_set(TD_EINVAL, "bad word at entry %d: %d tokens in %d entries left", i,
                               L, cfg->n_bad - i - 1);
            for (int32_t k = 1; k <= L; k++)
                if (cfg->bad[i + k] < 0 || cfg->bad[i + k] >= n_vocab)
                    return err_set(TD_EINVAL, "bad word token %d: outside the vocabulary of %lld",
                                   cfg->bad[i + k], (long long)n_vocab);
            longest = L > longest ? L : longest;
            p->n_bad_words++;
        }
        p->hist_cap = longest - 1;
        ok = (p->bad = malloc((size_t)cfg->n_bad * sizeof *p->bad)) != NULL &&
             (p->hist = malloc((size_t)(longest > 1 ? longest - 1 : 1) * sizeof *p->hist)) !=
                 NULL;
        if (ok)
            memcpy(p->bad, cfg->bad, (size_t)cfg->n_bad * sizeof *p->bad);
        p->n_bad = cfg->n_bad;
    }
    if (cfg->n_allowed > 0) {
        ok = (p->allow = calloc((size_t)OPS_MASK_WORDS(n_vocab), sizeof *p->allow)) != NULL;
        for (int32_t i = 0; ok && i < cfg->n_allowed; i++) {
            const int32_t t = cfg->allowed[i];
            if (t < 0 || t >= n_vocab) {
                pen_free(p, NULL);
                return err_set(TD_EINVAL, "allowed token %d: outside the vocabulary of %lld", t,
                               (long long)n_vocab);
            }
            p->allow[t / 32] |= 1u << (t % 32);
        }
    }
    if (ok && counted)
        ok = (p->count = calloc((size_t)n_vocab, sizeof *p->count)) != NULL;
    if (ok && p->rep != 1.0f)
        ok = (p->in_prompt = calloc((size_t)n_vocab, 1)) != NULL;
    if (ok && (least || cfg->n_bad > 0)) { /* where: the -inf entries' dedup */
        ok = (p->where = malloc((size_t)n_vocab * sizeof *p->where)) != NULL;
        for (int64_t t = 0; ok && t < n_vocab; t++)
            p->where[t] = -1;
    }
    if (ok && least) {
        ok = (p->stop = malloc((size_t)cfg->n_stop * sizeof *p->stop)) != NULL;
        for (int32_t i = 0; ok && i < cfg->n_stop; i++) {
            const int32_t t = cfg->stop[i];
            if (t < 0 || t >= n_vocab || p->where[t] == 0)
                continue;
            p->where[t] = 0; /* marks the ones taken; reset below */
            p->stop[p->n_stop++] = t;
        }
        for (int32_t i = 0; ok && i < p->n_stop; i++)
            p->where[p->stop[i]] = -1;
        p->min_tokens = cfg->min_tokens;
    }
    if (ok && cfg->n_bias > 0) {
        ok = (p->bias = malloc((size_t)cfg->n_bias * sizeof *p->bias)) != NULL;
        for (int32_t i = 0; ok && i < cfg->n_bias; i++)
            p->bias[i] = (ops_logit_add){cfg->bias_tok[i], 1.0f, cfg->bias[i]};
        p->n_bias = ok ? cfg->n_bias : 0;
        if (ok)
            qsort(p->bias, (size_t)p->n_bias, sizeof *p->bias, pen_by_tok);
        for (int32_t i = 1; i < p->n_bias; i++)
            if (p->bias[i].tok == p->bias[i - 1].tok) {
                const int32_t t = p->bias[i].tok;
                pen_free(p, NULL);
                return err_set(TD_EINVAL, "logit bias for token %d: given twice", t);
            }
    }
    if (!ok) {
        pen_free(p, NULL);
        return err_set(TD_ENOMEM, "out of memory for the logit bias and penalties");
    }
    return TD_OK;
}

void pen_free(pen_state *p, const ops_backend *be)
{
    if (be && p->dev)
        be->release(be, p->dev);
    if (be && p->allow_dev)
        be->release(be, p->allow_dev);
    free(p->allow);
    free(p->bias);
    free(p->count);
    free(p->seen);
    free(p->in_prompt);
    free(p->ptok);
    free(p->stop);
    free(p->where);
    free(p->bad);
    free(p->hist);
    free(p->host);
    memset(p, 0, sizeof *p);
}

td_err pen_start(pen_state *p, const int32_t *prompt, int64_t n_prompt)
{
    for (int64_t i = 0; p->count && i < p->n_seen; i++)
        p->count[p->seen[i]] = 0;
    p->n_seen = 0;
    p->n_emitted = 0;
    p->n_hist = 0;
    if (!p->in_prompt)
        return TD_OK;
    for (int64_t i = 0; i < p->n_ptok; i++)
        p->in_prompt[p->ptok[i]] = 0;
    p->n_ptok = 0;
    free(p->ptok);
    p->ptok = NULL;
    if (n_prompt <= 0)
        return TD_OK;
    if (!(p->ptok = malloc((size_t)n_prompt * sizeof *p->ptok)))
        return err_set(TD_ENOMEM, "out of memory for the repetition penalty's prompt tokens");
    for (int64_t i = 0; i < n_prompt; i++) {
        const int32_t t = prompt[i];
        if (t >= 0 && t < p->n_vocab && !p->in_prompt[t]) {
            p->in_prompt[t] = 1;
            p->ptok[p->n_ptok++] = t;
        }
    }
    return TD_OK;
}

/* One more emission of t (a valid id, p->count set). */
static td_err pen_count_up(pen_state *p, int32_t t)
{
    if (p->count[t]++ > 0)
        return TD_OK;
    if (p->n_seen == p->seen_cap) {
        int64_t cap = p->seen_cap ? 2 * p->seen_cap : 256;
        int32_t *s = realloc(p->seen, (size_t)cap * sizeof *s);
        if (!s) {
            p->count[t]--;
            return err_set(TD_ENOMEM, "out of memory for the penalties' token counts");
        }
        p->seen = s;
        p->seen_cap = cap;
    }
    p->seen[p->n_seen++] = t;
    return TD_OK;
}

/* Undoes the last pen_count_up of t. */
static void pen_count_down(pen_state *p, int32_t t)
{
    if (--p->count[t] == 0)
        p->n_seen--; /* t was the last one seen: count-ups are undone in reverse */
}

td_err pen_emit(pen_state *p, const int32_t *tok, int64_t n)
{
    p->n_emitted += n;
    for (int64_t i = 0; p->hist_cap > 0 && i < n; i++) { /* the last hist_cap, oldest first */
        if (p->n_hist == p->hist_cap)
            memmove(p->hist, p->hist + 1, (size_t)(p->hist_cap - 1) * sizeof *p->hist);
        else
            p->n_hist++;
        p->hist[p->n_hist - 1] = tok[i];
    }
    for (int64_t i = 0; p->count && i < n; i++)
        if (tok[i] >= 0 && tok[i] < p->n_vocab)
            TD_TRY(pen_count_up(p, tok[i]));
    return TD_OK;
}

/* Token t's bias (0 when it has none). */
static float pen_bias(const pen_state *p, int32_t t)
{
    const ops_logit_add key = {t, 1.0f, 0.0f};
    const ops_logit_add *b =
        p->n_bias ? bsearch(&key, p->bias, (size_t)p->n_bias, sizeof key, pen_by_tok) : NULL;
    return b ? b->delta : 0.0f;
}

/* What a token's logit gets with c emissions before it: the one definition of the value. */
static float pen_value(const pen_state *p, int32_t t, uint32_t c)
{
    const float b = pen_bias(p, t);
    return c ? b - fmaf(p->frequency, (float)c, p->presence) : b;
}

/* A buffer's new capacity for at least bytes: doubled from cap (4 KiB at first). */
static size_t pen_grown(size_t cap, size_t bytes)
{
    cap = cap ? cap : 4096;
    while (cap < bytes)
        cap *= 2;
    return cap;
}

/* Host staging of at least bytes. */
static td_err pen_host_room(pen_state *p, size_t bytes)
{
    if (bytes <= p->host_cap)
        return TD_OK;
    const size_t cap = pen_grown(p->host_cap, bytes);
    unsigned char *h = realloc(p->host, cap);
    if (!h)
        return err_set(TD_ENOMEM, "out of memory for the logit bias and penalties");
    p->host = h;
    p->host_cap = cap;
    return TD_OK;
}

/* Token t's logit becomes -inf in the row being built (entries e [*k], p->where marking
 * them). */
static void pen_refuse(pen_state *p, ops_logit_add *e, int32_t *k, int32_t t)
{
    if (p->where[t] >= 0) {
        e[p->where[t]].delta = -INFINITY;
        return;
    }
    p->where[t] = *k;
    e[(*k)++] = (ops_logit_add){t, 1.0f, -INFINITY};
}

/* Whether the tokens generated before row i (the history, then drafts [0, i)) end with
 * w [m]. */
static bool pen_bad_ends(const pen_state *p, const int32_t *w, int32_t m, const int32_t *drafts,
                         int64_t i)
{
    if ((int64_t)p->n_hist + i < m)
        return false;
    for (int32_t k = 0; k < m; k++) { /* k-th from the end */
        const int32_t t = k < i ? drafts[i - 1 - k] : p->hist[p->n_hist - 1 - (k - i)];
        if (t != w[m - 1 - k])
            return false;
    }
    return true;
}

/* Builds rows 0..n-1 into p->host; the entry count goes to *m, the header's bytes to *hdr. */
static td_err pen_build(pen_state *p, const int32_t *drafts, int64_t n, size_t *hdr, int32_t *m)
{
    const size_t per_row =
        (size_t)(p->n_seen + p->n_ptok + p->n_bias + p->n_stop + p->n_bad_words + n);
    *hdr = ((size_t)(n + 1) * sizeof(int32_t) + 7) & ~(size_t)7;
    TD_TRY(pen_host_room(p, *hdr + (size_t)n * per_row * sizeof(ops_logit_add)));
    int32_t *off = (int32_t *)p->host;
    ops_logit_add *e = (ops_logit_add *)(p->host + *hdr);
    int32_t k = 0;
    int64_t counted = 0; /* drafts [0, counted) are in the counts for now */
    td_err err = TD_OK;
    for (int64_t i = 0; i < n; i++) {
        if (i > 0 && p->count) {
            const int32_t d = drafts[i - 1];
            if (d >= 0 && d < p->n_vocab && (err = pen_count_up(p, d)) != TD_OK)
                break;
            counted = i;
        }
        off[i] = k;
        /* the tokens with a count (seen holds exactly those), the prompt's others, then the
         * biased ones in neither */
        for (int64_t j = 0; p->count && j < p->n_seen; j++) {
            const int32_t t = p->seen[j];
            const float v = pen_value(p, t, p->count[t]);
            if (v != 0.0f || p->rep != 1.0f)
                e[k++] = (ops_logit_add){t, p->rep, v};
        }
        for (int64_t j = 0; j < p->n_ptok; j++) {
            const int32_t t = p->ptok[j];
            if (p->count[t] == 0)
                e[k++] = (ops_logit_add){t, p->rep, pen_bias(p, t)};
        }
        for (int32_t j = 0; j < p->n_bias; j++) {
            const ops_logit_add b = p->bias[j];
            const bool listed = p->count && (p->count[b.tok] > 0 ||
                                             (p->in_prompt && p->in_prompt[b.tok]));
            if (!listed && b.delta != 0.0f)
                e[k++] = b;
        }
        /* too few tokens yet: the stop tokens' logits become -inf; so do the bad words' last
         * tokens whose others end what was generated before the row; each token once */
        const bool least = p->n_emitted + i < p->min_tokens;
        if (least || p->n_bad > 0) {
            for (int32_t j = off[i]; j < k; j++)
                p->where[e[j].tok] = j;
            for (int32_t j = 0; least && j < p->n_stop; j++)
                pen_refuse(p, e, &k, p->stop[j]);
            for (int32_t j = 0; j < p->n_bad; j += 1 + p->bad[j])
                if (pen_bad_ends(p, p->bad + j + 1, p->bad[j] - 1, drafts, i))
                    pen_refuse(p, e, &k, p->bad[j + p->bad[j]]);
            for (int32_t j = off[i]; j < k; j++)
                p->where[e[j].tok] = -1;
        }
    }
    off[n] = k;
    for (int64_t i = counted; i >= 1; i--) {
        const int32_t d = drafts[i - 1];
        if (d >= 0 && d < p->n_vocab)
            pen_count_down(p, d);
    }
    *m = k;
    return err;
}

/* The allowed set on rows 0..n-1 (the mask copied to the backend once per block size). */
static td_err pen_allow(pen_state *p, const ops_backend *be, float *logits, int64_t n)
{
    const size_t W = (size_t)OPS_MASK_WORDS(p->n_vocab);
    if (n > p->allow_rows) {
        uint32_t *rows = malloc((size_t)n * W * sizeof *rows);
        void *d = NULL;
        td_err e = rows ? be->alloc(be, &d, (size_t)n * W * sizeof *rows)
                        : err_set(TD_ENOMEM, "out of memory for the allowed tokens");
        for (int64_t i = 0; e == TD_OK && i < n; i++)
            memcpy(rows + (size_t)i * W, p->allow, W * sizeof *rows);
        if (e == TD_OK)
            e = be->to_device(be, d, rows, (size_t)n * W * sizeof *rows);
        free(rows);
        if (e != TD_OK) {
            if (d)
                be->release(be, d);
            return e;
        }
        if (p->allow_dev)
            be->release(be, p->allow_dev);
        p->allow_dev = d;
        p->allow_rows = n;
    }
    return be->logit_mask(be, logits, n, p->n_vocab, (const uint32_t *)p->allow_dev);
}

td_err pen_apply(pen_state *p, const ops_backend *be, float *logits, const int32_t *drafts,
                 int64_t n)
{
    if (!p->on || n <= 0)
        return TD_OK;
    TD_ASSERT(n == 1 || drafts != NULL);
    if (p->allow)
        TD_TRY(pen_allow(p, be, logits, n));
    size_t hdr = 0;
    int32_t m = 0;
    TD_TRY(pen_build(p, drafts, n, &hdr, &m));
    if (m == 0)
        return TD_OK;
    const size_t bytes = hdr + (size_t)m * sizeof(ops_logit_add);
    if (bytes > p->dev_cap) {
        const size_t cap = pen_grown(p->dev_cap, bytes);
        void *d = NULL;
        TD_TRY(be->alloc(be, &d, cap));
        if (p->dev)
            be->release(be, p->dev);
        p->dev = d;
        p->dev_cap = cap;
    }
    TD_TRY(be->to_device(be, p->dev, p->host, bytes));
    return be->logit_add(be, logits, n, p->n_vocab, (const int32_t *)p->dev,
                         (const ops_logit_add *)((unsigned char *)p->dev + hdr));
}
