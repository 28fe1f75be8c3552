/* One sequence's speculative loop: prefill, draft, verify, accept, roll back. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "verifyd/spec.h"

static double spec_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool spec_greedy(const spec_seq *s)
{
    return s->sampler.temperature == 0.0f;
}

/* Tokens an in-process step verifies at most (1 without a drafter). */
static int64_t spec_most(const spec_seq *s)
{
    return s->dm ? spec_block_most(s->block, s->draft_max) : 1;
}

td_err spec_init(spec_seq *s, const tgt_model *tm, const dfl_model *dm, int64_t n_ctx,
                 int64_t ring, const ops_sampler *sampler)
{
    spec_cfg cfg = {.dm = dm, .n_ctx = n_ctx, .ring = ring, .block = 1, .sampler = *sampler};
    return spec_init_cfg(s, tm, &cfg);
}

td_err spec_init_cfg(spec_seq *s, const tgt_model *tm, const spec_cfg *cfg)
{
    memset(s, 0, sizeof *s);
    const dfl_model *dm = cfg->dm;
    s->tm = tm;
    s->dm = dm;
    s->sampler = cfg->sampler;
    s->block = dm ? dm->cfg.block_size : cfg->block;
    s->draft_max = cfg->draft_max;
    s->prefill_chunk = 64;
    if (s->draft_max < 0)
        return err_set(TD_EINVAL, "at most %lld drafts per step", (long long)s->draft_max);
    if (s->block < 1 || s->block > SPEC_MAX_BLOCK)
        return err_set(TD_ENOTSUP, "block size %lld is outside 1..%d", (long long)s->block,
                       SPEC_MAX_BLOCK);
    s->draft_auto = dm && cfg->draft_auto;
    bp_init(&s->bp, spec_most(s));
    s->lp_rows = s->block;
    if (cfg->prompt_logprobs) {
        if (dm)
            return err_set(TD_ENOTSUP, "prompt log probabilities with an in-process drafter");
        TD_ASSERT(cfg->prompt_top >= 0 && cfg->prompt_top <= OPS_TOP_LOGPROBS_MAX);
        s->prompt_lp = true;
        s->prompt_top = cfg->prompt_top;
        s->prefill_chunk = SPEC_PROMPT_LP_ROWS;
        if (s->lp_rows < SPEC_PROMPT_LP_ROWS)
            s->lp_rows = SPEC_PROMPT_LP_ROWS;
    }
    TD_ASSERT(!cfg->feat_ring || cfg->ring_rows > 0);
    int64_t V = tm->hp.n_vocab, D = tm->hp.n_embd;
    TD_TRY(pen_init(&s->pen, &cfg->pen, V));
    td_err e = cst_init(&s->cst, &cfg->cst, cfg->vocab, s->block);
    if (e != TD_OK) {
        pen_free(&s->pen, NULL);
        return e;
    }
    e = cfg->state ? tgt_state_bind(&s->ts, tm, cfg->n_ctx, cfg->state)
                   : tgt_state_init(&s->ts, tm, cfg->n_ctx);
    if (e != TD_OK) {
        pen_free(&s->pen, NULL);
        cst_free(&s->cst, NULL);
        return e;
    }
    if (dm) {
        e = dfl_state_init(&s->ds, dm, cfg->ring > 0 ? cfg->ring : 4096);
        s->n_taps = dm->cfg.n_taps;
    } else {
        s->n_taps = cfg->n_taps;
    }
    if (s->n_taps) {
        s->taps = malloc((size_t)s->n_taps * sizeof(int32_t));
        for (int64_t i = 0; s->taps && i < s->n_taps; i++)
            s->taps[i] = dm ? (int32_t)dm->cfg.target_layer_ids[i] : cfg->taps[i];
    }
    s->ring = cfg->feat_ring;
    s->ring_rows = cfg->ring_rows;
    s->ring_bf16 = cfg->ring_bf16;
    int64_t rows = s->block > s->prefill_chunk ? s->block : s->prefill_chunk;
    const ops_backend *be = tm->be;
    size_t fbytes = (size_t)(rows * (s->n_taps ? s->n_taps : 1) * D) * sizeof(float);
    size_t lbytes = (size_t)(s->block * V) * sizeof(float);
    if (e == TD_OK)
        e = be->alloc(be, (void **)&s->feat, fbytes);
    if (e == TD_OK)
        e = be->alloc(be, (void **)&s->logits, (size_t)(s->lp_rows * V) * sizeof(float));
    if (e == TD_OK && dm)
        e = be->alloc(be, (void **)&s->dlogits, lbytes);
    if (e == TD_OK && s->draft_auto)
        e = be->alloc(be, (void **)&s->pend,
                      (size_t)(SPEC_MAX_BLOCK * s->n_taps * D) * sizeof(float));
    if (e == TD_OK)
        e = be->alloc(be, (void **)&s->ids, (size_t)(2 * s->block + 2) * sizeof(int32_t));
    /* Sampling compares distributions next to the logits: p for every row of a block, and
     * the drafts' q. */
    if (e == TD_OK && !spec_greedy(s))
        e = be->alloc(be, (void **)&s->dp, lbytes);
    if (e == TD_OK && !spec_greedy(s) && s->block > 1)
        e = be->alloc(be, (void **)&s->dq, lbytes - (size_t)V * sizeof(float));
    /* For a sequence whose blocks are drafted elsewhere (verifyd): host room for drafts'
     * distributions that arrive in a message, and backend room for the log probabilities of
     * emitted tokens. The in-process loop needs neither. */
    const bool host_q = !dm && !spec_greedy(s) && s->block > 1;
    if (e == TD_OK && !dm)
        e = be->alloc(be, (void **)&s->lp_tok, (size_t)s->lp_rows * sizeof *s->lp_tok);
    if (e == TD_OK && !dm)
        e = be->alloc(be, (void **)&s->lp, (size_t)s->lp_rows * sizeof *s->lp);
    if (host_q)
        s->q = malloc(lbytes);
    if (e == TD_OK && ((host_q && !s->q) || (s->n_taps && !s->taps)))
        e = err_set(TD_ENOMEM, "out of memory for a sequence");
    if (e != TD_OK)
        spec_free(s);
    return e;
}

void spec_free(spec_seq *s)
{
    pen_free(&s->pen, s->tm ? s->tm->be : NULL);
    cst_free(&s->cst, s->tm ? s->tm->be : NULL);
    tgt_state_free(&s->ts);
    if (s->dm)
        dfl_state_free(&s->ds);
    if (s->tm) {
        const ops_backend *be = s->tm->be;
        be->release(be, s->feat);
        be->release(be, s->logits);
        be->release(be, s->dlogits);
        be->release(be, s->pend);
        be->release(be, s->ids);
        be->release(be, s->dp);
        be->release(be, s->dq);
        be->release(be, s->lp_tok);
        be->release(be, s->lp);
    }
    free(s->taps);
    free(s->q);
    memset(s, 0, sizeof *s);
}

int64_t spec_room(const spec_seq *s)
{
    return s->ts.n_ctx - s->ts.n_past;
}

/* Argmax of each of rows rows of backend logits into host ids: only the ids cross. */
static td_err spec_argmax(spec_seq *s, const float *logits, int64_t rows, int32_t *ids)
{
    const ops_backend *be = s->tm->be;
    TD_TRY(be->argmax(be, s->ids, logits, rows, s->tm->hp.n_vocab));
    return be->to_host(be, ids, s->ids, (size_t)rows * sizeof(int32_t));
}

/* Lossless speculative sampling of the block [block[0], d1..d(B-1)] whose target logits are
 * s->logits, block[0] at position L, drafts drawn from q [B-1][n_vocab] (backend memory): accept
 * d_i with probability min(1, p(d_i) / q(d_i)); on the first rejection draw from
 * normalize(max(p - q, 0)) (p when that is all zero); after a full accept draw the bonus
 * token from the last p. Runs on the backend next to the logits (be->accept_sampled): only
 * {a, next} come to the host. B == 1 is a plain draw at position L + 1. */
static td_err spec_accept_sampled(spec_seq *s, const int32_t *block, int64_t B, int64_t L,
                                  const float *q, int64_t *acc, int32_t *next)
{
    const ops_backend *be = s->tm->be;
    int64_t V = s->tm->hp.n_vocab;
    int32_t *result = s->ids + s->block, *draft = result + 2, r[2];
    if (B > 1)
        TD_TRY(be->to_device(be, draft, block + 1, (size_t)(B - 1) * sizeof(int32_t)));
    ops_accept_rng rng = {
        .accept = dfl_rng_ctr(L, DFL_RNG_ACCEPT), .target = dfl_rng_ctr(L, DFL_RNG_TARGET),
        .step = dfl_rng_ctr(L + 1, DFL_RNG_TARGET) - dfl_rng_ctr(L, DFL_RNG_TARGET),
    };
    TD_TRY(be->accept_sampled(be, result, s->dp, s->logits, B > 1 ? q : NULL,
                              B > 1 ? draft : NULL, B, V, &s->sampler, &rng));
    TD_TRY(be->to_host(be, r, result, sizeof r));
    if (r[1] < 0 || r[1] >= V)
        return err_set(TD_EINVAL, "no finite target logit to sample from at position %lld",
                       (long long)(L + r[0] + 1));
    *acc = r[0];
    *next = r[1];
    return TD_OK;
}

/* The token at position pos from the first row of s->logits: the argmax when greedy, else a
 * draw; both on the backend. */
static td_err spec_pick(spec_seq *s, int64_t pos, int32_t *tok)
{
    TD_TRY(pen_apply(&s->pen, s->tm->be, s->logits, NULL, 1));
    TD_TRY(cst_apply(&s->cst, s->tm->be, s->logits, NULL, 1));
    if (spec_greedy(s))
        return spec_argmax(s, s->logits, 1, tok);
    int64_t a;
    return spec_accept_sampled(s, NULL, 1, pos - 1, NULL, &a, tok);
}

/* Runs tokens through the target with the tap features going to s->feat; logits of the
 * last token (or of all with all_logits) land in s->logits. */
static td_err spec_run(spec_seq *s, const int32_t *tokens, int64_t n, bool record,
                       bool all_logits)
{
    tgt_out out = {
        .logits = s->logits, .last_only = !all_logits, .taps = s->taps, .n_taps = s->n_taps,
        .tap_out = s->n_taps ? s->feat : NULL,
    };
    return tgt_forward(s->tm, &s->ts, tokens, n, record, &out);
}

/* The features waiting in s->pend go to the drafter's context. */
static td_err spec_flush_context(spec_seq *s)
{
    const int64_t n = s->n_pend;
    s->n_pend = 0;
    return n ? dfl_add_context(s->dm, &s->ds, s->pend, n) : TD_OK;
}

/* The first n rows of s->feat are committed positions pos0..pos0+n-1: they go to the
 * in-process drafter's context (with draft_auto, after a generation's step: to s->pend, to
 * be added when the drafter next runs) and to the feature ring. */
static td_err spec_keep_features(spec_seq *s, int64_t pos0, int64_t n)
{
    const ops_backend *be = s->tm->be;
    const size_t row = (size_t)(s->n_taps * s->tm->hp.n_embd);
    if (s->pend && !s->prompt) {
        if (s->n_pend + n > SPEC_MAX_BLOCK)
            TD_TRY(spec_flush_context(s));
        TD_TRY(be->copy(be, s->pend + (size_t)s->n_pend * row, s->feat,
                        (size_t)n * row * sizeof(float)));
        s->n_pend += n;
    } else if (s->dm) {
        TD_TRY(dfl_add_context(s->dm, &s->ds, s->feat, n));
    }
    if (s->ring) {
        /* The ring is backend memory too (a kvd pool of the backend's kind): rows stay on the
         * device; at most two copies (or conversions to bf16), one on each side of the wrap. */
        for (int64_t i = 0; i < n;) {
            int64_t r = (pos0 + i) % s->ring_rows;
            int64_t m = n - i < s->ring_rows - r ? n - i : s->ring_rows - r;
            const float *src = s->feat + (size_t)i * row;
            if (s->ring_bf16)
                TD_TRY(be->to_bf16(be, (uint16_t *)s->ring + (size_t)r * row, src,
                                   (int64_t)((size_t)m * row)));
            else
                TD_TRY(be->copy(be, (float *)s->ring + (size_t)r * row, src,
                                (size_t)m * row * sizeof(float)));
            i += m;
        }
    }
    return TD_OK;
}

td_err spec_prefill_begin(spec_seq *s, const int32_t *prompt, int64_t n, int64_t n_cached)
{
    if (n <= 0)
        return err_set(TD_ERANGE, "the prompt is empty");
    if (n >= s->ts.n_ctx)
        return err_set(TD_ERANGE, "the prompt (%lld tokens) leaves no room in a context of %lld",
                       (long long)n, (long long)s->ts.n_ctx);
    for (int64_t i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= s->tm->hp.n_vocab)
            return err_set(TD_ERANGE, "prompt token %lld (id %d) is outside the vocabulary of %lld",
                           (long long)i, prompt[i], (long long)s->tm->hp.n_vocab);
    TD_ASSERT(n_cached >= 0 && n_cached < n &&
              (n_cached == 0 || (!s->dm && !s->prompt_lp && s->ts.bound)));
    if (n_cached == 0) {
        TD_TRY(tgt_state_reset(s->tm, &s->ts));
    } else {
        s->ts.n_past = n_cached;
        s->ts.rec_n_tok = 0;
    }
    if (s->dm)
        dfl_state_reset(&s->ds);
    s->n_pend = 0;
    memset(&s->stats, 0, sizeof s->stats);
    TD_TRY(pen_start(&s->pen, prompt, n));
    cst_reset(&s->cst);
    s->prompt = prompt;
    s->n_prompt = n;
    s->prompt_at = n_cached;
    s->n_plp = 0;
    s->has_pending = false;
    return TD_OK;
}

/* The log probabilities of the prompt tokens that the m rows of a prefill pass from prompt
 * position at predict (row i: token at + i + 1, while there is one), into s->plp; then,
 * when the pass ends the prompt, its last row goes to row 0, where the first token is picked. */
static td_err spec_prompt_logprobs(spec_seq *s, int64_t at, int64_t m)
{
    const ops_backend *be = s->tm->be;
    const int64_t V = s->tm->hp.n_vocab;
    const int64_t k = at + m < s->n_prompt ? m : m - 1;
    TD_ASSERT(m <= SPEC_PROMPT_LP_ROWS && m <= s->lp_rows);
    s->plp_first = at + 1;
    s->n_plp = k;
    if (k > 0) {
        TD_TRY(be->to_device(be, s->lp_tok, s->prompt + at + 1, (size_t)k * sizeof(int32_t)));
        TD_TRY(be->logprob_rows(be, s->lp, s->logits, s->lp_tok, k, V, s->prompt_top));
        TD_TRY(be->to_host(be, s->plp, s->lp, (size_t)k * sizeof *s->lp));
    }
    if (k < m && m > 1)
        TD_TRY(be->copy(be, s->logits, s->logits + (m - 1) * V, (size_t)V * sizeof(float)));
    return TD_OK;
}

td_err spec_prefill_next(spec_seq *s, bool *done, int32_t *first)
{
    TD_ASSERT(s->prompt && s->prompt_at < s->n_prompt);
    *done = false;
    double t0 = spec_now();
    int64_t at = s->prompt_at, n = s->n_prompt;
    int64_t m = n - at < s->prefill_chunk ? n - at : s->prefill_chunk;
    TD_TRY(spec_run(s, s->prompt + at, m, false, s->prompt_lp));
    TD_TRY(spec_keep_features(s, at, m));
    if (s->prompt_lp)
        TD_TRY(spec_prompt_logprobs(s, at, m));
    s->prompt_at += m;
    if (s->prompt_at == n) {
        TD_TRY(spec_pick(s, n, first));
        TD_TRY(pen_emit(&s->pen, first, 1));
        TD_TRY(cst_emit(&s->cst, first, 1));
        s->pending = *first;
        s->has_pending = true;
        s->stats.generated = 1;
        s->prompt = NULL;
        *done = true;
    }
    s->stats.t_prefill += spec_now() - t0;
    return TD_OK;
}

td_err spec_prefill(spec_seq *s, const int32_t *prompt, int64_t n, int32_t *first)
{
    TD_TRY(spec_prefill_begin(s, prompt, n, 0));
    bool done = false;
    while (!done)
        TD_TRY(spec_prefill_next(s, &done, first));
    return TD_OK;
}

/* Greedy acceptance: the longest run of drafts equal to the target's argmax, found on the
 * backend next to the logits; only {a, next} come to the host. */
static td_err spec_accept_greedy(spec_seq *s, const int32_t *block, int64_t B, int64_t *acc,
                                 int32_t *next)
{
    const ops_backend *be = s->tm->be;
    int32_t *argmax = s->ids, *result = s->ids + s->block, *draft = result + 2, r[2];
    if (B > 1)
        TD_TRY(be->to_device(be, draft, block + 1, (size_t)(B - 1) * sizeof(int32_t)));
    TD_TRY(be->accept_greedy(be, argmax, result, s->logits, draft, B, s->tm->hp.n_vocab));
    TD_TRY(be->to_host(be, r, result, sizeof r));
    *acc = r[0];
    *next = r[1];
    return TD_OK;
}

td_err spec_verify(spec_seq *s, const int32_t *block, int64_t B, const float *q, int32_t *out,
                   int64_t *n_out)
{
    TD_ASSERT(s->has_pending && block[0] == s->pending && B >= 1);
    TD_ASSERT(B == 1 || spec_greedy(s) || q);
    *n_out = 0;
    int64_t room = spec_room(s), L = s->ts.n_past;
    if (room < 1)
        return err_set(TD_ERANGE, "context full at %lld positions", (long long)s->ts.n_ctx);
    if (B > s->block || B > room)
        return err_set(TD_ERANGE, "a block of %lld tokens with block size %lld and %lld "
                       "positions left", (long long)B, (long long)s->block, (long long)room);
    B = 1 + cst_allowed(&s->cst, block + 1, B - 1);
    double t1 = spec_now();
    tgt_graph_counts g0, g1;
    tgt_graph_stats(s->tm, &g0);
    s->recorded = false;
    TD_TRY(spec_run(s, block, B, B > 1, B > 1));
    tgt_graph_stats(s->tm, &g1);
    s->recorded = g1.recorded != g0.recorded;
    TD_TRY(pen_apply(&s->pen, s->tm->be, s->logits, block + 1, B));
    TD_TRY(cst_apply(&s->cst, s->tm->be, s->logits, block + 1, B));
    int64_t a = 0;
    int32_t next;
    if (spec_greedy(s)) {
        TD_TRY(spec_accept_greedy(s, block, B, &a, &next));
    } else {
        TD_TRY(spec_accept_sampled(s, block, B, L, q, &a, &next));
    }
    if (B > 1)
        TD_TRY(tgt_state_keep(s->tm, &s->ts, a + 1));
    double t2 = spec_now();
    TD_TRY(spec_keep_features(s, L, a + 1));
    double t3 = spec_now();

    for (int64_t i = 1; i <= a; i++)
        out[i - 1] = block[i];
    out[a] = next;
    *n_out = a + 1;
    TD_TRY(pen_emit(&s->pen, out, a + 1));
    TD_TRY(cst_emit(&s->cst, out, a + 1));
    s->pending = next;
    s->stats.steps++;
    s->stats.generated += a + 1;
    s->stats.drafted += B - 1;
    s->stats.accepted += a;
    s->stats.accept_hist[a + 1]++;
    s->stats.t_draft += t3 - t2;
    s->stats.t_verify += t2 - t1;
    return TD_OK;
}

td_err spec_step(spec_seq *s, int32_t *out, int64_t *n_out)
{
    TD_ASSERT(s->has_pending);
    *n_out = 0;
    int64_t room = spec_room(s), L = s->ts.n_past;
    if (room < 1)
        return err_set(TD_ERANGE, "context full at %lld positions", (long long)s->ts.n_ctx);
    int64_t B = s->draft_auto ? bp_pick(&s->bp) : spec_most(s);
    if (B > room)
        B = room;
    int32_t block[SPEC_MAX_BLOCK];
    block[0] = s->pending;
    double t0 = spec_now();
    if (B > 1 && s->n_pend) { /* the plain steps' context: theirs, not this step's cost */
        TD_TRY(spec_flush_context(s));
        const double t = spec_now();
        s->stats.t_draft += t - t0;
        t0 = t;
    }
    if (B > 1) {
        TD_TRY(dfl_propose(s->dm, &s->ds, s->pending, B - 1, s->dlogits));
        TD_TRY(dfl_draft_tokens(s->tm->be, &s->sampler, s->dlogits, B, s->tm->hp.n_vocab, L,
                                s->ids, block, s->dq));
    }
    s->stats.t_draft += spec_now() - t0;
    TD_TRY(spec_verify(s, block, B, s->dq, out, n_out));
    if (s->draft_auto) /* a step that recorded a CUDA graph: its time is not the size's */
        bp_record(&s->bp, B, *n_out, s->recorded ? 0 : spec_now() - t0);
    return TD_OK;
}
