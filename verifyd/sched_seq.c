/* One sequence's units of work inside verifyd's scheduler: a prefill chunk or a speculative
 * step (block from draftd, or a plain step), stop conditions, log probabilities, events. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "verifyd/sched.h"

static double seq_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static msg_usage seq_usage(const sched_seq *seq)
{
    return (msg_usage){
        .prompt_tokens = seq->req->gs.n_prompt, .completion_tokens = seq->completion,
        .steps = (uint32_t)seq->spec.stats.steps, .cached_tokens = seq->n_cached,
        .predicted_tokens = seq->predicted < seq->completion ? seq->predicted : seq->completion,
    };
}

/* Returns the slot to kvd: kept for the prefix cache with every committed token when the
 * state is whole. */
static void seq_close_slot(sched *s, sched_seq *seq, bool keep)
{
    if (!s->kvd || !kvc_alive(&s->kv))
        return; /* kvd is gone: the slot went with it */
    int64_t n_past = seq->spec_ok ? seq->spec.ts.n_past : 0;
    keep = keep && seq->spec_ok && !seq->prefilling && n_past > 0;
    msg_kv_close m = {.slot = seq->slot, .slot_gen = seq->slot_gen, .keep = keep};
    uint32_t *tokens = NULL;
    if (keep) {
        tokens = malloc((size_t)n_past * sizeof *tokens);
        if (!tokens) {
            m.keep = false;
        } else {
            for (int64_t i = 0; i < n_past; i++)
                tokens[i] = (uint32_t)seq->hist[i];
            m.tokens = tokens;
            m.n_tokens = (uint32_t)n_past;
        }
    }
    if (kvc_close(s->kvd, ++s->kv_request_id, &m, 2000) != TD_OK)
        LOG_WARN("closing slot %u: %s", seq->slot, err_msg());
    free(tokens);
}

void sched_seq_finish(sched *s, sched_seq *seq, msg_finish finish, td_err code)
{
    msg_gen_event ev = {.seq_id = seq->req->gs.seq_id, .usage = seq_usage(seq)};
    if (code != TD_OK) {
        ev.kind = MSG_EVENT_ERROR;
        ev.finish = MSG_FINISH_ERROR;
        ev.code = code;
        snprintf(ev.message, sizeof ev.message, "%s", err_msg());
        LOG_WARN("sequence %llu failed: %s: %s", (unsigned long long)ev.seq_id, err_name(code),
                 ev.message);
    } else {
        ev.kind = MSG_EVENT_DONE;
        ev.finish = finish;
    }
    events_send(s->ev, &ev);
    seq_close_slot(s, seq, code == TD_OK);
    seq->done = true;
}

static bool seq_is_stop(const sched *s, const msg_gen_start *gs, int32_t tok)
{
    for (uint32_t i = 0; i < gs->n_stop; i++)
        if ((int32_t)gs->stop[i] == tok)
            return true;
    return !gs->ignore_eos && s->cfg.eog && s->cfg.eog[tok];
}

_Static_assert(MSG_TOP_LOGPROBS_MAX == OPS_TOP_LOGPROBS_MAX, "one limit of alternatives");

/* The backend's records h[n] as the message's. */
static void seq_lp_msg(const ops_logprob *h, int64_t n, msg_logprob *lps)
{
    for (int64_t i = 0; i < n; i++) {
        memset(&lps[i], 0, sizeof lps[i]);
        lps[i].logprob = h[i].logprob;
        lps[i].rank = h[i].rank > 0 ? (uint32_t)h[i].rank : 0;
        lps[i].n_top = (uint32_t)h[i].n_top;
        for (int32_t j = 0; j < h[i].n_top; j++) {
            lps[i].top_id[j] = (uint32_t)h[i].top_id[j];
            lps[i].top_logprob[j] = h[i].top_logprob[j];
        }
    }
}

/* lps[n]: the log probabilities of out[n] under rows 0..n-1 of the last pass's logits with
 * n_top alternatives each, computed on the backend beside the logits (only the n small
 * records come to the host). */
static td_err seq_logprobs(sched_seq *seq, const int32_t *out, int64_t n, uint32_t n_top,
                           msg_logprob *lps)
{
    spec_seq *sp = &seq->spec;
    const ops_backend *be = sp->tm->be;
    ops_logprob h[SPEC_MAX_BLOCK];
    TD_ASSERT(n >= 1 && n <= SPEC_MAX_BLOCK && n <= sp->block && n_top <= OPS_TOP_LOGPROBS_MAX);
    TD_TRY(be->to_device(be, sp->lp_tok, out, (size_t)n * sizeof *out));
    TD_TRY(be->logprob_rows(be, sp->lp, sp->logits, sp->lp_tok, n, sp->tm->hp.n_vocab,
                            (int)n_top));
    TD_TRY(be->to_host(be, h, sp->lp, (size_t)n * sizeof *h));
    seq_lp_msg(h, n, lps);
    return TD_OK;
}

/* The prompt tokens' log probabilities of the last prefill pass, as a PROMPT event. */
static void seq_prompt_event(sched *s, sched_seq *seq)
{
    const spec_seq *sp = &seq->spec;
    msg_logprob lps[SPEC_PROMPT_LP_ROWS];
    uint32_t tokens[SPEC_PROMPT_LP_ROWS];
    if (sp->n_plp == 0)
        return;
    seq_lp_msg(sp->plp, sp->n_plp, lps);
    for (int64_t i = 0; i < sp->n_plp; i++)
        tokens[i] = (uint32_t)seq->prompt[sp->plp_first + i];
    msg_gen_event ev = {
        .seq_id = seq->req->gs.seq_id, .kind = MSG_EVENT_PROMPT, .tokens = tokens,
        .n_tokens = (uint32_t)sp->n_plp, .logprobs = lps, .n_logprobs = (uint32_t)sp->n_plp,
        .usage = seq_usage(seq),
    };
    events_send(s->ev, &ev);
}

/* Emits out[n] (token i chosen from row i of spec.logits): stops at a stop token (kept) or
 * at max_tokens, drops what follows, then ends the sequence when it is done or the context
 * is full. */
static void seq_emit(sched *s, sched_seq *seq, const int32_t *out, int64_t n)
{
    const msg_gen_start *gs = &seq->req->gs;
    msg_finish finish = MSG_FINISH_NONE;
    int64_t keep = 0;
    while (keep < n && finish == MSG_FINISH_NONE) {
        int32_t tok = out[keep++];
        seq->completion++;
        if (seq_is_stop(s, gs, tok))
            finish = MSG_FINISH_STOP;
        else if (seq->completion >= gs->max_tokens)
            finish = MSG_FINISH_LENGTH;
    }
    if (finish == MSG_FINISH_NONE && spec_room(&seq->spec) < 1)
        finish = MSG_FINISH_LENGTH;
    pthread_mutex_lock(&s->lock);
    s->stats.completion_tokens += (uint64_t)keep;
    pthread_mutex_unlock(&s->lock);
    msg_logprob lps[SPEC_MAX_BLOCK];
    uint32_t tokens[SPEC_MAX_BLOCK];
    td_err le = gs->logprobs ? seq_logprobs(seq, out, keep, gs->top_logprobs, lps) : TD_OK;
    if (le != TD_OK) {
        sched_seq_finish(s, seq, MSG_FINISH_ERROR, le);
        return;
    }
    for (int64_t i = 0; i < keep; i++)
        tokens[i] = (uint32_t)out[i];
    msg_gen_event ev = {
        .seq_id = gs->seq_id, .kind = MSG_EVENT_TOKEN, .tokens = tokens,
        .n_tokens = (uint32_t)keep, .logprobs = gs->logprobs ? lps : NULL,
        .n_logprobs = gs->logprobs ? (uint32_t)keep : 0, .usage = seq_usage(seq),
    };
    events_send(s->ev, &ev);
    if (finish != MSG_FINISH_NONE)
        sched_seq_finish(s, seq, finish, TD_OK);
}

/* The B - 1 distributions of a proposal where they lie in kvd's proposal pool (*q): the
 * acceptance reads them there, on the backend (the pool is backend memory). draftd made them
 * visible before replying and writes nothing more until the next proposal, which this
 * scheduler asks for only after the verify. */
static td_err seq_pool_q(sched *s, const msg_proposal *p, int64_t B, const float **q)
{
    const kvc *kv = &s->kv;
    int64_t V = s->cfg.tm->hp.n_vocab;
    uint64_t bytes = (uint64_t)(B - 1) * (uint64_t)V * sizeof(float);
    if (!kv->q || p->q_gen != kv->q_gen)
        return err_set(TD_EPROTO, "the proposal pool of generation %llu is not mapped",
                       (unsigned long long)p->q_gen);
    if (p->q_offset > shbuf_size(kv->q) || bytes > shbuf_size(kv->q) - p->q_offset)
        return err_set(TD_EPROTO, "%llu bytes at offset %llu of a proposal pool of %llu",
                       (unsigned long long)bytes, (unsigned long long)p->q_offset,
                       (unsigned long long)shbuf_size(kv->q));
    if (p->q_offset % sizeof(float) != 0)
        return err_set(TD_EPROTO, "a proposal pool offset of %llu bytes",
                       (unsigned long long)p->q_offset);
    *q = (const float *)(kvc_base(kv->q) + p->q_offset);
    return TD_OK;
}

/* Asks draftd for B - 1 tokens; fills block[1..B) and (sampling) points *q at the dense q
 * rows in backend memory (kvd's proposal pool, or sp->dq for rows that came in the message).
 * Returns the block size to verify: B, or 1 when the proposal failed. */
static int64_t seq_draft(sched *s, sched_seq *seq, int32_t *block, int64_t B, const float **q)
{
    spec_seq *sp = &seq->spec;
    const msg_gen_start *gs = &seq->req->gs;
    int64_t V = s->cfg.tm->hp.n_vocab;
    bool greedy = gs->sampler.temperature == 0.0f;
    msg_propose req = {
        .seq_id = gs->seq_id, .slot = seq->slot, .slot_gen = seq->slot_gen,
        .pool_gen = s->kv.target_gen, .n_past = (uint32_t)sp->ts.n_past,
        .pending = (uint32_t)sp->pending, .n_draft = (uint32_t)(B - 1), .sampler = gs->sampler,
    };
    double t0 = seq_now();
    /* The features this step added to the ring must be in memory before draftd reads them
     * (another process: nothing orders its GPU work after ours). */
    const ops_backend *be = s->cfg.tm->be;
    if (be->sync(be) != TD_OK) {
        LOG_WARN("waiting for the feature ring: %s", err_msg());
        return 1;
    }
    int timeout = s->cfg.draft_timeout_ms;
    if (timeout < 4000.0 * s->verify_ema)
        timeout = (int)(4000.0 * s->verify_ema);
    msg_proposal p;
    td_err e = dlink_propose(s->draft, &req, &p, timeout);
    s->stats.draft_us += (uint64_t)((seq_now() - t0) * 1e6);
    if (e != TD_OK)
        return 1;
    bool in_pool = p.q_rows > 0;
    if (p.n_tokens < (uint32_t)(B - 1) ||
        (!greedy && (in_pool ? p.q_rows : p.n_q) != p.n_tokens)) {
        LOG_WARN("draftd proposed %u tokens (%u distributions) for %lld", p.n_tokens,
                 in_pool ? p.q_rows : p.n_q, (long long)(B - 1));
        msg_free_proposal(&p);
        return 1;
    }
    if (!greedy && in_pool && seq_pool_q(s, &p, B, q) != TD_OK) {
        LOG_WARN("draftd's distributions: %s", err_msg());
        msg_free_proposal(&p);
        return 1;
    }
    int64_t ok = B;
    for (int64_t i = 1; i < B && ok == B; i++) {
        block[i] = (int32_t)p.tokens[i - 1];
        if (p.tokens[i - 1] >= (uint32_t)V)
            ok = 1;
        if (greedy || in_pool || ok != B)
            continue;
        float *row = sp->q + (i - 1) * V;
        memset(row, 0, (size_t)V * sizeof *row);
        const msg_draft_q *dq = &p.q[i - 1];
        for (uint32_t j = 0; j < dq->n; j++) {
            if (dq->ids[j] >= (uint32_t)V) {
                ok = 1;
                break;
            }
            row[dq->ids[j]] = dq->p[j];
        }
    }
    if (ok != B)
        LOG_WARN("draftd proposed a token outside the vocabulary of %lld", (long long)V);
    msg_free_proposal(&p);
    if (ok == B && !greedy && !in_pool) { /* the rows came in the message, to the host */
        if (be->to_device(be, sp->dq, sp->q, (size_t)((B - 1) * V) * sizeof(float)) != TD_OK) {
            LOG_WARN("draftd's distributions to the backend: %s", err_msg());
            return 1;
        }
        *q = sp->dq;
    }
    return ok;
}

#define SEQ_PRED_SYNC 4 /* generated tokens that place the output in the prediction again */

/* out[n] were emitted (and are in hist): where the output now stands in the prediction. Off
 * it, the last SEQ_PRED_SYNC generated tokens are looked for in the prediction, and the
 * output follows it again after their first occurrence. */
static void seq_pred_follow(sched_seq *seq, const int32_t *out, int64_t n)
{
    const msg_gen_start *gs = &seq->req->gs;
    const int64_t np = gs->n_predict;
    if (np == 0)
        return;
    for (int64_t i = 0; i < n; i++)
        seq->pred_at = seq->pred_at >= 0 && seq->pred_at < np &&
                               gs->predict[seq->pred_at] == (uint32_t)out[i]
                           ? seq->pred_at + 1
                           : -1;
    if (seq->pred_at >= 0)
        return;
    const int64_t gen = seq->n_hist - gs->n_prompt;
    const int64_t k = gen < SEQ_PRED_SYNC ? gen : SEQ_PRED_SYNC;
    const int32_t *tail = seq->hist + seq->n_hist - k;
    for (int64_t j = k; k > 0 && j <= np; j++) {
        int64_t m = 0;
        while (m < k && gs->predict[j - k + m] == (uint32_t)tail[m])
            m++;
        if (m == k) {
            seq->pred_at = j;
            return;
        }
    }
}

/* The prediction's next tokens as block[1..): the block's size (1 when the output does not
 * follow the prediction). Sampling compares them with the target as proposals drawn with
 * certainty: their rows of *q are one-hot, in sp->dq. */
static int64_t seq_predict(sched *s, sched_seq *seq, int32_t *block, int64_t B, const float **q)
{
    const msg_gen_start *gs = &seq->req->gs;
    spec_seq *sp = &seq->spec;
    const int64_t left = seq->pred_at >= 0 ? (int64_t)gs->n_predict - seq->pred_at : 0;
    const int64_t k = left < B - 1 ? left : B - 1;
    if (k <= 0)
        return 1;
    for (int64_t i = 0; i < k; i++)
        block[1 + i] = (int32_t)gs->predict[seq->pred_at + i];
    if (gs->sampler.temperature == 0.0f)
        return 1 + k;
    const ops_backend *be = s->cfg.tm->be;
    const int64_t V = s->cfg.tm->hp.n_vocab;
    static const float one = 1.0f;
    td_err e = be->zero(be, sp->dq, (size_t)(k * V) * sizeof(float));
    for (int64_t i = 0; e == TD_OK && i < k; i++)
        e = be->to_device(be, sp->dq + i * V + block[1 + i], &one, sizeof one);
    if (e != TD_OK) {
        LOG_WARN("the prediction's proposals: %s", err_msg());
        return 1;
    }
    *q = sp->dq;
    return 1 + k;
}

static void seq_step(sched *s, sched_seq *seq)
{
    spec_seq *sp = &seq->spec;
    int64_t room = spec_room(sp);
    const int64_t most = sched_verify_block(&s->cfg);
    int64_t B = most < room ? most : room;
    int32_t block[SPEC_MAX_BLOCK], out[SPEC_MAX_BLOCK];
    block[0] = sp->pending;
    const float *q = NULL;
    const double t_step = seq_now();
    const int64_t predicted = B > 1 ? seq_predict(s, seq, block, B, &q) : 1;
    int64_t want = B; /* of a step that drafts or decodes plainly */
    if (predicted > 1)
        B = predicted;
    else if (B > 1 && (!s->draft || !dlink_up(s->draft)))
        B = want = 1;
    else if (B > 1) {
        if (s->cfg.draft_auto) {
            const int64_t pick = bp_pick(&seq->bp);
            want = pick < B ? pick : B;
        }
        B = want > 1 ? seq_draft(s, seq, block, want, &q) : 1;
    }
    double t0 = seq_now();
    int64_t n = 0;
    td_err e = spec_verify(sp, block, B, B > 1 ? q : NULL, out, &n);
    double dt = seq_now() - t0;
    if (e != TD_OK) {
        sched_seq_finish(s, seq, MSG_FINISH_ERROR, e);
        return;
    }
    /* what a drafted (or plain) step cost, unless its proposal failed */
    if (s->cfg.draft_auto && predicted <= 1 && B == want) {
        const double t = sp->recorded ? 0 : seq_now() - t_step; /* not a graph's time */
        bp_record(&seq->bp, B, n, t);
        bp_record(&s->bp, B, n, t);
    }
    s->verify_ema = s->verify_ema == 0 ? dt : 0.9 * s->verify_ema + 0.1 * dt;
    pthread_mutex_lock(&s->lock);
    s->stats.steps++;
    s->stats.drafted += (uint64_t)(B - 1);
    s->stats.accepted += (uint64_t)(n - 1);
    s->stats.accept_hist[n]++;
    s->stats.verify_us += (uint64_t)(dt * 1e6);
    pthread_mutex_unlock(&s->lock);
    if (predicted > 1)
        seq->predicted += (uint32_t)(n - 1);
    for (int64_t i = 0; i < n; i++)
        seq->hist[seq->n_hist++] = out[i];
    seq_pred_follow(seq, out, n);
    seq_emit(s, seq, out, n);
}

static void seq_prefill(sched *s, sched_seq *seq)
{
    bool done = false;
    int32_t first = 0;
    double t0 = seq_now();
    td_err e = spec_prefill_next(&seq->spec, &done, &first);
    pthread_mutex_lock(&s->lock);
    s->stats.prefill_us += (uint64_t)((seq_now() - t0) * 1e6);
    pthread_mutex_unlock(&s->lock);
    if (e != TD_OK) {
        sched_seq_finish(s, seq, MSG_FINISH_ERROR, e);
        return;
    }
    if (seq->req->gs.prompt_logprobs)
        seq_prompt_event(s, seq);
    if (!done)
        return;
    seq->prefilling = false;
    if (seq->req->gs.max_tokens == 0) { /* the prompt only */
        sched_seq_finish(s, seq, MSG_FINISH_LENGTH, TD_OK);
        return;
    }
    seq->hist[seq->n_hist++] = first;
    seq_pred_follow(seq, &first, 1);
    seq_emit(s, seq, &first, 1);
}

void sched_seq_unit(sched *s, sched_seq *seq)
{
    if (seq->prefilling)
        seq_prefill(s, seq);
    else
        seq_step(s, seq);
}
