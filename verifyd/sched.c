/* verifyd's scheduler: the request queue, kvd's slots, the round-robin over running
 * sequences, and the bus handler (see sched.h). */
#include "verifyd/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/daemon.h"
#include "common/log.h"

#define SCHED_ATTACH_RETRY_MS 250 /* kvd attach attempts while it is away */
#define SCHED_ATTACH_REFUSED_MS 2000 /* and while it refuses the layout (e.g. no room) */
#define SCHED_KV_TIMEOUT_MS 2000  /* kv_open / kv_close calls */

static long long sched_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sched_req_free(sched_req *r)
{
    if (!r)
        return;
    msg_free_gen_start(&r->gs);
    cst_compiled_free(&r->format);
    free(r);
}

/* The last event of a request that never got a sequence. */
static void sched_req_end(sched *s, sched_req *r, msg_finish finish, td_err code)
{
    msg_gen_event ev = {.seq_id = r->gs.seq_id, .usage = {.prompt_tokens = r->gs.n_prompt}};
    if (code != TD_OK) {
        ev.kind = MSG_EVENT_ERROR;
        ev.finish = MSG_FINISH_ERROR;
        ev.code = code;
        snprintf(ev.message, sizeof ev.message, "%s", err_msg());
    } else {
        ev.kind = MSG_EVENT_DONE;
        ev.finish = finish;
    }
    events_send(s->ev, &ev);
}

static void sched_seq_free(sched_seq *seq)
{
    if (seq->spec_ok)
        spec_free(&seq->spec);
    free(seq->prompt);
    free(seq->hist);
    free(seq);
}

/* --- kvd ---------------------------------------------------------------------------------- */

static void sched_fail_running(sched *s, td_err code)
{
    char why[MSG_ERROR_MAX + 1];
    snprintf(why, sizeof why, "%s", err_msg());
    for (uint32_t i = 0; i < s->n_running; i++) {
        sched_seq *seq = s->running[i];
        if (seq->done)
            continue;
        err_set(code, "%s", why);
        sched_seq_finish(s, seq, MSG_FINISH_ERROR, code);
    }
}

/* What the drafter still needs on the GPU when kvd sizes its pools: its weights and
 * SCHED_DRAFTD_WORK while draftd is not up (once it answers, they are taken already and
 * kvd sees them as used); 0 on the CPU or without a drafter. At the first attach a draftd
 * that is up gets a few probes' time to be seen. */
static uint64_t sched_draft_reserve(sched *s, bool gpu)
{
    if (!gpu || !s->draft || !s->cfg.d_layers)
        return 0;
    for (int i = 0; i < 3 && !s->attached_once && !dlink_up(s->draft); i++) {
        struct timespec ts = {0, DLINK_PROBE_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    return dlink_up(s->draft) ? 0 : s->cfg.d_weight_bytes + SCHED_DRAFTD_WORK;
}

static td_err sched_attach(sched *s)
{
    const bool gpu = s->cfg.tm->be->kind == OPS_BACKEND_CUDA;
    const tgt_hparams *hp = &s->cfg.tm->hp;
    uint32_t taps[MSG_TAPS_MAX];
    for (int64_t i = 0; i < s->cfg.n_taps; i++)
        taps[i] = (uint32_t)s->cfg.taps[i];
    msg_kv_attach req = {
        .role = MSG_ROLE_VERIFYD, .pid = (uint32_t)getpid(), .taps = taps,
        .n_taps = (uint32_t)s->cfg.n_taps,
        .params = {
            .n_ctx = (uint32_t)s->cfg.n_ctx, .ring = (uint32_t)s->cfg.ring,
            .block = (uint32_t)s->cfg.block, .n_attn = (uint32_t)s->cfg.tm->n_attn_layers,
            .n_kv = (uint32_t)hp->n_head_kv, .head_dim = (uint32_t)hp->head_dim,
            .n_delta = (uint32_t)s->cfg.tm->n_delta_layers, .n_v_head = (uint32_t)hp->n_v_head,
            .d_k = (uint32_t)hp->d_k, .d_v = (uint32_t)hp->d_v,
            .conv_k = (uint32_t)(s->cfg.tm->n_delta_layers ? hp->conv_k : 0),
            .conv_ch = (uint32_t)hp->conv_ch, .n_taps = (uint32_t)s->cfg.n_taps,
            .n_embd = (uint32_t)hp->n_embd, .n_vocab = (uint32_t)hp->n_vocab,
            .kv_bytes = tgt_kv_bytes(s->cfg.tm),
            /* a GPU's drafter reads the features rounded to bf16: the ring keeps just that */
            .feat_bytes = s->cfg.n_taps ? (gpu ? 2 : 4) : 0,
            /* the drafter's context, for kvd's sizing of the pools only */
            .d_layers = s->cfg.d_layers, .d_kv = s->cfg.d_kv, .d_head_dim = s->cfg.d_head_dim,
            .d_kv_bytes = s->cfg.d_layers ? tgt_kv_bytes(s->cfg.tm) : 0,
        },
        .n_heads = s->cfg.n_heads,
        .reserve = sched_draft_reserve(s, gpu),
    };
    int fds[MSG_HEADS_MAX];
    uint32_t n_fds = 0;
    td_err e = TD_OK;
    for (; e == TD_OK && n_fds < s->cfg.n_heads; n_fds++) {
        shbuf_desc d;
        if ((e = shbuf_export(s->cfg.heads[n_fds], &d, &fds[n_fds])) != TD_OK)
            break;
        kvc_announce_from_desc(&req.heads[n_fds], &d);
    }
    if (e == TD_OK)
        e = kvc_attach_fds(&s->kv, s->cfg.kvd_fd_path, &req, fds, n_fds, 2000);
    for (uint32_t i = 0; i < n_fds; i++)
        close(fds[i]);
    TD_TRY(e);
    uint32_t slots = s->kv.lay.p.slots;
    if (slots > KVL_SLOTS_MAX || s->kv.lay.p.n_ctx != (uint32_t)s->cfg.n_ctx ||
        s->kv.lay.p.kv_bytes != req.params.kv_bytes) {
        kvc_detach(&s->kv);
        return err_set(TD_EPROTO, "kvd answered with another layout");
    }
    if ((kvc_kind(&s->kv) == SHBUF_KIND_CUDA) != gpu ||
        (gpu && memcmp(kvc_device_uuid(&s->kv), s->cfg.dev_uuid, CUDRV_UUID_BYTES) != 0)) {
        char want[CUDRV_UUID_STR_LEN] = "host memory";
        if (gpu)
            cudrv_uuid_format(s->cfg.dev_uuid, want);
        kvc_detach(&s->kv);
        return err_set(TD_EINVAL, "kvd's pools are not where the target runs (%s): start kvd "
                       "with the same --device as verifyd", want);
    }
    pthread_mutex_lock(&s->lock);
    s->slots = slots;
    s->ready = true;
    s->attached_once = true;
    s->not_ready[0] = '\0';
    pthread_mutex_unlock(&s->lock);
    LOG_INFO("attached to kvd: %u slots of %lld positions, pool generation %llu", slots,
             (long long)s->cfg.n_ctx, (unsigned long long)s->kv.target_gen);
    return TD_OK;
}

/* Notices kvd going away (its fd connection hangs up) and attaches again when it is back. */
static void sched_kvd_check(sched *s)
{
    if (s->ready && !kvc_alive(&s->kv)) {
        LOG_WARN("kvd went away: running sequences end with an error");
        pthread_mutex_lock(&s->lock);
        s->ready = false;
        pthread_mutex_unlock(&s->lock);
        err_set(TD_ECLOSED, "kvd went away; the sequence's memory is gone");
        sched_fail_running(s, TD_ECLOSED);
        kvc_detach(&s->kv);
    }
    if (!s->ready && sched_now_ms() >= s->next_attach_ms) {
        td_err e = sched_attach(s);
        if (e != TD_OK) {
            /* kvd not (yet) there is normal at start; anything else says what to fix, once
             * while it stays the same */
            const bool away = e == TD_ENOENT || e == TD_ECLOSED || e == TD_ETIMEOUT;
            char why[sizeof s->not_ready];
            snprintf(why, sizeof why, "%s: %s", away ? "waiting for kvd" : "kvd attach",
                     err_msg());
            if (away || strcmp(why, s->not_ready) == 0)
                LOG_DEBUG("%s", why);
            else
                LOG_WARN("%s", why);
            pthread_mutex_lock(&s->lock);
            memcpy(s->not_ready, why, sizeof why);
            pthread_mutex_unlock(&s->lock);
            s->next_attach_ms =
                sched_now_ms() + (away ? SCHED_ATTACH_RETRY_MS : SCHED_ATTACH_REFUSED_MS);
        }
    }
}

/* --- admission ---------------------------------------------------------------------------- */

static ops_sampler sched_sampler(const msg_sampler *m)
{
    return (ops_sampler){
        .temperature = m->temperature, .top_k = m->top_k > INT32_MAX ? INT32_MAX : (int32_t)m->top_k,
        .top_p = m->top_p, .min_p = m->min_p, .seed = m->seed,
    };
}

/* A request's response format as its sequence applies it. */
static cst_cfg sched_cst_cfg(const sched_req *r)
{
    const msg_gen_start *gs = &r->gs;
    const bool think = gs->format != MSG_FORMAT_TEXT;
    return (cst_cfg){
        .format = gs->format, .schema = gs->schema, .n_schema = gs->n_schema,
        .compiled = &r->format,
        .think_open = think && gs->think_open,
        .think_start = think && gs->think_start != MSG_TOKEN_NONE ? (int32_t)gs->think_start : -1,
        .think_end = think && gs->think_end != MSG_TOKEN_NONE ? (int32_t)gs->think_end : -1,
    };
}

/* A sequence for r in slot g (the slot is closed again on failure). */
static td_err sched_seq_new(sched *s, sched_req *r, const msg_kv_slot *g, sched_seq **out)
{
    const msg_gen_start *gs = &r->gs;
    const kvl_layout *lay = &s->kv.lay;
    sched_seq *seq = calloc(1, sizeof *seq);
    if (!seq)
        return err_set(TD_ENOMEM, "out of memory for a sequence");
    seq->req = r;
    seq->slot = g->slot;
    seq->slot_gen = g->slot_gen;
    /* prompt log probabilities need every prompt position's logits: nothing is reused */
    seq->n_cached = gs->prompt_logprobs ? 0 : g->n_cached;
    seq->prefilling = true;
    seq->prompt = malloc((size_t)gs->n_prompt * sizeof *seq->prompt);
    seq->hist = malloc((size_t)(s->cfg.n_ctx + 1) * sizeof *seq->hist);
    td_err e = TD_OK;
    if (!seq->prompt || !seq->hist)
        e = err_set(TD_ENOMEM, "out of memory for a sequence");
    for (uint32_t i = 0; e == TD_OK && i < gs->n_prompt; i++)
        seq->prompt[i] = seq->hist[i] = (int32_t)gs->prompt[i];
    seq->n_hist = gs->n_prompt;
    seq->pred_at = gs->n_predict ? 0 : -1; /* the output is expected to open as predicted */
    seq->bp = s->bp; /* what every sequence's steps measured so far */
    uint8_t *base = kvc_target_slot(&s->kv, g->slot);
    tgt_state_mem mem = {
        .k = (float *)(base + lay->k), .v = (float *)(base + lay->v),
        .ssm = (float *)(base + lay->ssm), .conv = (float *)(base + lay->conv),
        .rec_ssm0 = (float *)(base + lay->rec_ssm0), .rec_conv0 = (float *)(base + lay->rec_conv0),
        .rec_xconv = (float *)(base + lay->rec_xconv), .rec_qkv = (float *)(base + lay->rec_qkv),
        .rec_gb = (float *)(base + lay->rec_gb), .rec_cap = lay->p.block,
    };
    spec_cfg cfg = {
        .n_ctx = s->cfg.n_ctx, .block = s->cfg.block, .taps = s->cfg.taps,
        .n_taps = s->cfg.n_taps, .state = &mem,
        .feat_ring = s->cfg.n_taps ? base + lay->feat : NULL,
        .ring_rows = s->cfg.ring, .ring_bf16 = lay->p.feat_bytes == 2,
        .sampler = sched_sampler(&gs->sampler),
        .pen = {.presence = gs->presence_penalty, .frequency = gs->frequency_penalty,
                .bias_tok = (const int32_t *)gs->bias_tok, .bias = gs->bias,
                .n_bias = (int32_t)gs->n_bias, .repetition = gs->repetition_penalty,
                .min_tokens = gs->min_tokens > INT32_MAX ? INT32_MAX : (int32_t)gs->min_tokens,
                .stop = (const int32_t *)gs->stop, .n_stop = (int32_t)gs->n_stop,
                .allowed = (const int32_t *)gs->allowed, .n_allowed = (int32_t)gs->n_allowed,
                .bad = (const int32_t *)gs->bad, .n_bad = (int32_t)gs->n_bad},
        .cst = sched_cst_cfg(r),
        .vocab = s->cfg.vocab,
        .prompt_logprobs = gs->prompt_logprobs,
        .prompt_top = (int32_t)gs->top_logprobs,
    };
    if (e == TD_OK && (e = spec_init_cfg(&seq->spec, s->cfg.tm, &cfg)) == TD_OK)
        seq->spec_ok = true;
    if (e == TD_OK)
        e = spec_prefill_begin(&seq->spec, seq->prompt, gs->n_prompt, seq->n_cached);
    if (e != TD_OK) {
        msg_kv_close c = {.slot = g->slot, .slot_gen = g->slot_gen};
        char why[MSG_ERROR_MAX + 1];
        snprintf(why, sizeof why, "%s", err_msg());
        kvc_close(s->kvd, ++s->kv_request_id, &c, SCHED_KV_TIMEOUT_MS);
        err_set(e, "%s", why);
        sched_seq_free(seq);
        return e;
    }
    *out = seq;
    return TD_OK;
}

/* Ends the waiting requests that were cancelled. */
static void sched_sweep_cancelled(sched *s)
{
    sched_req *gone = NULL;
    pthread_mutex_lock(&s->lock);
    for (sched_req **p = &s->waiting; *p;) {
        if ((*p)->cancel) {
            sched_req *r = *p;
            *p = r->next;
            r->next = gone;
            gone = r;
            s->n_waiting--;
        } else {
            p = &(*p)->next;
        }
    }
    pthread_mutex_unlock(&s->lock);
    while (gone) {
        sched_req *r = gone;
        gone = r->next;
        sched_req_end(s, r, MSG_FINISH_CANCEL, TD_OK);
        sched_req_free(r);
    }
}

/* Gives waiting requests slots while kvd has them. */
static void sched_admit(sched *s)
{
    while (s->ready && s->n_running < s->slots) {
        pthread_mutex_lock(&s->lock);
        sched_req *r = s->waiting;
        pthread_mutex_unlock(&s->lock);
        if (!r)
            return;
        msg_kv_open open = {.pid = (uint32_t)getpid(), .tokens = r->gs.prompt,
                            .n_tokens = r->gs.n_prompt};
        msg_kv_slot g;
        td_err e = kvc_open(s->kvd, ++s->kv_request_id, &open, &g, SCHED_KV_TIMEOUT_MS);
        if (e == TD_EBUSY)
            return; /* every slot is busy: wait for one */
        if (e == TD_OK && g.pool_gen != s->kv.target_gen) {
            msg_kv_close c = {.slot = g.slot, .slot_gen = g.slot_gen};
            kvc_close(s->kvd, ++s->kv_request_id, &c, SCHED_KV_TIMEOUT_MS);
            kvc_detach(&s->kv); /* first: the old slots are not the new kvd's to close */
            err_set(TD_ECLOSED, "kvd was restarted; the sequence's memory is gone");
            sched_fail_running(s, TD_ECLOSED);
            pthread_mutex_lock(&s->lock);
            s->ready = false;
            pthread_mutex_unlock(&s->lock);
            return;
        }
        sched_seq *seq = NULL;
        if (e == TD_OK && (g.slot >= s->slots || g.n_cached >= r->gs.n_prompt))
            e = err_set(TD_EPROTO, "kvd granted slot %u with %u cached tokens", g.slot,
                        g.n_cached);
        if (e == TD_OK)
            e = sched_seq_new(s, r, &g, &seq);
        pthread_mutex_lock(&s->lock);
        s->waiting = r->next;
        s->n_waiting--;
        r->next = NULL;
        if (e == TD_OK) {
            s->running[s->n_running] = seq;
            s->running_req[s->n_running++] = r;
            s->stats.requests++;
            s->stats.prompt_tokens += r->gs.n_prompt;
            s->stats.cached_tokens += seq->n_cached;
        }
        pthread_mutex_unlock(&s->lock);
        if (e != TD_OK) {
            sched_req_end(s, r, MSG_FINISH_ERROR, e);
            sched_req_free(r);
        } else {
            LOG_DEBUG("sequence %llu: slot %u, %u of %u prompt tokens cached",
                      (unsigned long long)r->gs.seq_id, g.slot, seq->n_cached, r->gs.n_prompt);
        }
    }
}

/* Drops finished sequences, keeping the arrival order of the others. */
static void sched_compact(sched *s)
{
    pthread_mutex_lock(&s->lock);
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n_running; i++) {
        sched_seq *seq = s->running[i];
        if (seq->done) {
            sched_req_free(seq->req);
            sched_seq_free(seq);
            continue;
        }
        s->running[k] = seq;
        s->running_req[k++] = seq->req;
    }
    s->n_running = k;
    pthread_mutex_unlock(&s->lock);
}

static void *sched_main(void *arg)
{
    sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        bool stop = s->stop;
        pthread_mutex_unlock(&s->lock);
        if (stop)
            break;
        sched_kvd_check(s);
        sched_sweep_cancelled(s);
        sched_admit(s);
        sched_compact(s);
        if (s->n_running == 0) {
            pthread_mutex_lock(&s->lock);
            if (!s->stop) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 50 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&s->wake, &s->lock, &ts);
            }
            pthread_mutex_unlock(&s->lock);
            continue;
        }
        for (uint32_t i = 0; i < s->n_running; i++) {
            sched_seq *seq = s->running[i];
            pthread_mutex_lock(&s->lock);
            bool cancel = seq->req->cancel;
            pthread_mutex_unlock(&s->lock);
            if (cancel)
                sched_seq_finish(s, seq, MSG_FINISH_CANCEL, TD_OK);
            else
                sched_seq_unit(s, seq);
        }
        tgt_graph_counts gc; /* the target's, read on its own thread */
        tgt_graph_stats(s->cfg.tm, &gc);
        pthread_mutex_lock(&s->lock);
        s->stats.graphs = gc;
        pthread_mutex_unlock(&s->lock);
        sched_compact(s);
    }
    err_set(TD_ECANCELED, "verifyd is stopping");
    sched_fail_running(s, TD_ECANCELED);
    sched_compact(s);
    return NULL;
}

/* --- start / stop ------------------------------------------------------------------------- */

td_err sched_start(sched **out, const sched_cfg *cfg)
{
    *out = NULL;
    sched *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(TD_ENOMEM, "out of memory");
    s->cfg = *cfg;
    bp_init(&s->bp, sched_verify_block(cfg));
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    kvc_init(&s->kv);
    bus_opts o;
    bus_opts_default(&o);
    td_err e = bus_client_init(&s->kvd, cfg->kvd_url, &o);
    if (e == TD_OK)
        e = events_open(&s->ev, cfg->events_url, 250);
    if (e == TD_OK && cfg->draftd_url && cfg->block > 1)
        e = dlink_open(&s->draft, cfg->draftd_url,
                       cfg->tm->be->kind == OPS_BACKEND_CUDA ? DLINK_SPIN_US : 0);
    if (e == TD_OK && pthread_create(&s->thread, NULL, sched_main, s) != 0)
        e = err_set(TD_EIO, "cannot start the scheduler thread");
    if (e != TD_OK) {
        sched_stop(s);
        return e;
    }
    s->started = true;
    *out = s;
    return TD_OK;
}

void sched_stop(sched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->stop = true;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);
    if (s->started)
        pthread_join(s->thread, NULL);
    while (s->waiting) {
        sched_req *r = s->waiting;
        s->waiting = r->next;
        sched_req_free(r);
    }
    dlink_close(s->draft);
    events_close(s->ev);
    kvc_detach(&s->kv);
    bus_client_free(s->kvd);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* --- requests ----------------------------------------------------------------------------- */

/* The request with seq_id among the waiting and running ones (lock held), or NULL. */
static sched_req *sched_find(sched *s, uint64_t seq_id)
{
    for (sched_req *r = s->waiting; r; r = r->next)
        if (r->gs.seq_id == seq_id)
            return r;
    for (uint32_t i = 0; i < s->n_running; i++)
        if (s->running_req[i]->gs.seq_id == seq_id)
            return s->running_req[i];
    return NULL;
}

/* ids [n] of a gen_start field (what) against the vocabulary of V: code naming the first id
 * outside it. */
static td_err sched_ids_in_vocab(const uint32_t *ids, uint32_t n, int64_t V, td_err code,
                                 const char *what)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= (uint64_t)V)
            return err_set(code, "%s token %u (id %u) is outside the vocabulary of %lld", what, i,
                           ids[i], (long long)V);
    return TD_OK;
}

static td_err sched_gen_start(sched *s, uint64_t rid, const uint8_t *req, size_t len,
                              msg_buf *reply)
{
    sched_req *r = calloc(1, sizeof *r);
    if (!r)
        return err_set(TD_ENOMEM, "out of memory");
    td_err e = msg_unpack_gen_start(req, len, NULL, &r->gs);
    if (e != TD_OK) {
        free(r);
        return e;
    }
    r->request_id = rid;
    const msg_gen_start *gs = &r->gs;
    int64_t V = s->cfg.tm->hp.n_vocab;
    if ((int64_t)gs->n_prompt >= s->cfg.n_ctx)
        e = err_set(TD_ERANGE, "a prompt of %u tokens does not fit the context of %lld positions "
                    "(room is needed for at least one generated token)",
                    gs->n_prompt, (long long)s->cfg.n_ctx);
    if (e == TD_OK)
        e = sched_ids_in_vocab(gs->prompt, gs->n_prompt, V, TD_ERANGE, "prompt");
    for (uint32_t i = 0; e == TD_OK && i < gs->n_bias; i++)
        if (gs->bias_tok[i] >= (uint64_t)V)
            e = err_set(TD_EINVAL, "logit bias for token %u: outside the vocabulary of %lld",
                        gs->bias_tok[i], (long long)V);
    if (e == TD_OK)
        e = sched_ids_in_vocab(gs->allowed, gs->n_allowed, V, TD_EINVAL, "allowed");
    for (uint32_t i = 0; e == TD_OK && i < gs->n_bad; i += 1 + gs->bad[i]) /* msg checked */
        e = sched_ids_in_vocab(gs->bad + i + 1, gs->bad[i], V, TD_EINVAL, "bad word");
    if (e == TD_OK)
        e = sched_ids_in_vocab(gs->predict, gs->n_predict, V, TD_EINVAL, "prediction");
    if (e == TD_OK) {
        /* the format is checked and compiled here, once, so that a bad one is this request's
         * error rather than its sequence's */
        const cst_cfg cc = sched_cst_cfg(r);
        e = cst_compile(&cc, s->cfg.vocab, &r->format);
    }
    bool again = false;
    if (e == TD_OK) {
        pthread_mutex_lock(&s->lock);
        sched_req *dup = sched_find(s, gs->seq_id);
        if (!s->ready)
            e = err_set(TD_EBUSY, "verifyd is not ready: kvd is not attached");
        else if (dup && dup->request_id == rid)
            again = true;
        else if (dup)
            e = err_set(TD_EINVAL, "sequence %llu is already running",
                        (unsigned long long)gs->seq_id);
        else if (s->n_waiting >= s->cfg.max_queue)
            e = err_set(TD_EBUSY, "%u generations are already waiting for a slot",
                        s->n_waiting);
        if (e == TD_OK && !again) {
            sched_req **tail = &s->waiting;
            while (*tail)
                tail = &(*tail)->next;
            *tail = r;
            s->n_waiting++;
            pthread_cond_broadcast(&s->wake);
        }
        pthread_mutex_unlock(&s->lock);
    }
    uint64_t seq_id = gs->seq_id;
    if (e != TD_OK || again)
        sched_req_free(r);
    TD_TRY(e);
    msg_ack ack = {.id = seq_id};
    return msg_pack_ack(reply, rid, &ack);
}

static td_err sched_status(sched *s, uint64_t rid, msg_buf *reply)
{
    msg_status m = {0};
    snprintf(m.model, sizeof m.model, "%s", s->cfg.model_name);
    m.n_ctx = (uint32_t)s->cfg.n_ctx;
    m.n_vocab = (uint32_t)s->cfg.tm->hp.n_vocab;
    m.block = (uint32_t)sched_verify_block(&s->cfg);
    m.draft_attached = s->draft && dlink_up(s->draft);
    m.draft_attaches = s->draft ? dlink_attaches(s->draft) : 0;
    m.draft_failures = s->draft ? dlink_failures(s->draft) : 0;
    pthread_mutex_lock(&s->lock);
    m.ready = s->ready;
    m.slots = s->slots;
    m.active = s->n_running;
    m.queued = s->n_waiting;
    const sched_stats *st = &s->stats;
    m.requests = st->requests;
    m.prompt_tokens = st->prompt_tokens;
    m.cached_tokens = st->cached_tokens;
    m.completion_tokens = st->completion_tokens;
    m.steps = st->steps;
    m.drafted = st->drafted;
    m.accepted = st->accepted;
    m.prefill_us = st->prefill_us;
    m.draft_us = st->draft_us;
    m.verify_us = st->verify_us;
    m.graph_recorded = st->graphs.recorded;
    m.graph_replayed = st->graphs.replayed;
    m.graph_direct = st->graphs.direct;
    if (!s->ready)
        snprintf(m.not_ready, sizeof m.not_ready, "%s",
                 s->not_ready[0] ? s->not_ready : "waiting for kvd");
    m.n_hist = (uint32_t)(s->cfg.block + 1);
    memcpy(m.accept_hist, st->accept_hist, m.n_hist * sizeof m.accept_hist[0]);
    pthread_mutex_unlock(&s->lock);
    return msg_pack_status(reply, rid, &m);
}

td_err sched_handle(void *user, const uint8_t *req, size_t len, msg_buf *reply)
{
    sched *s = user;
    msg_header h;
    TD_TRY(msg_unpack_header(req, len, &h));
    td_err e = TD_OK;
    if (daemon_answer_common(req, len, &h, MSG_ROLE_VERIFYD, reply, &e))
        return e;
    switch (h.type) {
    case MSG_GEN_START:
        return sched_gen_start(s, h.request_id, req, len, reply);
    case MSG_GEN_CANCEL: {
        msg_gen_cancel m;
        TD_TRY(msg_unpack_gen_cancel(req, len, NULL, &m));
        pthread_mutex_lock(&s->lock);
        sched_req *r = sched_find(s, m.seq_id);
        if (r)
            r->cancel = true;
        pthread_cond_broadcast(&s->wake);
        pthread_mutex_unlock(&s->lock);
        msg_ack ack = {.id = m.seq_id};
        return msg_pack_ack(reply, h.request_id, &ack);
    }
    case MSG_STATUS_GET:
        TD_TRY(msg_unpack_status_get(req, len, NULL));
        return sched_status(s, h.request_id, reply);
    default:
        return err_set(TD_EPROTO, "verifyd does not answer %s messages", msg_type_name(h.type));
    }
}
