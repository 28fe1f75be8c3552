#include "gateway/gen.h"

#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/log.h"
#include "gateway/gen_int.h"

#define GEN_WAIT_MS 100 /* longest wait for one event before checking the client */
#define GEN_BUSY_RETRY_MS 50

static int64_t gen_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void gen_hex(char *out, size_t n_bytes)
{
    uint8_t raw[32];
    TD_ASSERT(n_bytes <= sizeof raw);
    if (getrandom(raw, n_bytes, 0) != (ssize_t)n_bytes) {
        uint64_t x = (uint64_t)gen_now_ms() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < n_bytes; i++, x = x * 6364136223846793005ull + 1442695040888963407ull)
            raw[i] = (uint8_t)(x >> 56);
    }
    for (size_t i = 0; i < n_bytes; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

void gen_reply_error(api_reply *r, const api_error *e)
{
    r->status = e->status;
    r->content_type = "application/json";
    r->body = apierr_render(e);
    r->body_len = r->body ? strlen(r->body) : 0;
    r->stream = NULL;
}

bool gen_client_gone(int fd)
{
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* --- starting -------------------------------------------------------------------------------- */

_Static_assert(REQ_BIAS_MAX <= MSG_BIAS_MAX, "a request's logit bias fits one message");
_Static_assert(2 + REQ_STOP_IDS_MAX <= MSG_STOP_MAX, "a request's stop ids fit one message");

/* A response format's reasoning block in a chat: the model's "<think>" / "</think>" tokens
 * (MSG_TOKEN_NONE where the vocabulary has no such pair), so that its reasoning stays free and
 * the format applies to the answer. A completion's text is all answer. */
static void gen_think_tokens(const api_stream *s, bool chat, msg_gen_start *m)
{
    const int32_t open = tok_id_of(s->g->tok, "<think>", 7);
    const int32_t close = tok_id_of(s->g->tok, "</think>", 8);
    const bool pair = chat && open >= 0 && close >= 0;
    m->think_open = pair && s->in_think;
    m->think_start = pair ? (uint32_t)open : MSG_TOKEN_NONE;
    m->think_end = pair ? (uint32_t)close : MSG_TOKEN_NONE;
}

/* Whether the generation should end now: its client left, the gateway stops, or its
 * background job was cancelled (s->cancelled). */
static bool gen_should_end(api_stream *s)
{
    if (s->job && bg_cancel_asked(s->job)) {
        s->cancelled = true;
        return true;
    }
    if (gen_client_gone(s->client_fd) || __atomic_load_n(&s->g->stopping, __ATOMIC_SEQ_CST)) {
        s->client_gone = true;
        return true;
    }
    return false;
}

/* Starts the choice s->rc.index at verifyd. While verifyd is busy it waits up to the timeout;
 * a background job waits, also while verifyd is down or loading, until it is cancelled or the
 * gateway stops. */
td_err gen_start(api_stream *s, api_error *e)
{
    gw_state *g = s->g;
    msg_status st;
    while (s->job && g->link && !(link_status(g->link, &st) && st.ready) && !gen_should_end(s)) {
        struct timespec ts = {0, GEN_BUSY_RETRY_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (s->cancelled)
        return apierr_set(e, 499, NULL, NULL, "the response was cancelled");
    if (!g->link || !link_status(g->link, &st))
        return apierr_set(e, 503, "backend_unavailable", NULL,
                          "The model server (verifyd) is not available; try again later.");
    if (!st.ready)
        return apierr_set(e, 503, "model_loading", NULL,
                          "The model is not ready yet (verifyd: %s); try again later.",
                          st.not_ready[0] ? st.not_ready : "loading");

    const gen_prompt *gp = gen_cur(s);
    uint32_t stop[2 + REQ_STOP_IDS_MAX];
    uint32_t n_stop = 0;
    for (int i = 0; i < 2 && !s->req.ignore_eos; i++)
        if (g->stop_ids[i] >= 0 && (i == 0 || g->stop_ids[1] != g->stop_ids[0]))
            stop[n_stop++] = (uint32_t)g->stop_ids[i];
    for (size_t i = 0; i < s->req.n_stop_ids; i++) /* the client's, with ignore_eos too */
        stop[n_stop++] = s->req.stop_ids[i];
    /* candidate i of a prompt of a seeded request: seed + i, so the candidates differ and
     * repeat */
    const uint32_t cand = s->rc.index % s->req.best_of;
    uint64_t seed = s->req.sampling.seed + cand;
    if (!s->req.sampling.has_seed && getrandom(&seed, sizeof seed, 0) != sizeof seed)
        seed = (uint64_t)gen_now_ms() + s->rc.index;
    const bool plp_now = gp->plp && gp->n_plp < gp->n; /* once: later choices reuse them */
    const uint32_t plp_top = plp_now ? gen_prompt_top(&s->req) : 0;
    msg_gen_start m = {
        .prompt = (const uint32_t *)gp->ids,
        .n_prompt = (uint32_t)gp->n,
        .max_tokens = gp->max_tokens,
        .sampler = {.temperature = (float)s->req.sampling.temperature,
                    .top_k = (uint32_t)s->req.sampling.top_k,
                    .top_p = (float)s->req.sampling.top_p,
                    .min_p = (float)s->req.sampling.min_p,
                    .seed = seed},
        .stop = stop,
        .n_stop = n_stop,
        .logprobs = s->req.logprobs || s->req.best_of > s->req.n, /* best_of ranks by them */
        .top_logprobs = s->req.logprobs && s->req.top_logprobs > plp_top ? s->req.top_logprobs
                                                                          : plp_top,
        .prompt_logprobs = plp_now,
        .ignore_eos = s->req.ignore_eos,
        .presence_penalty = (float)s->req.sampling.presence_penalty,
        .frequency_penalty = (float)s->req.sampling.frequency_penalty,
        .bias_tok = s->req.bias_tok,
        .bias = s->req.bias,
        .n_bias = (uint32_t)s->req.n_bias,
        .repetition_penalty = (float)s->req.sampling.repetition_penalty,
        .min_tokens = (uint32_t)s->req.sampling.min_tokens,
        .format = s->format,
        .predict = (const uint32_t *)s->predict.ids,
        .n_predict = (uint32_t)s->predict.n,
        .bad = s->bad,
        .n_bad = s->n_bad,
        .allowed = s->req.allowed,
        .n_allowed = (uint32_t)s->req.n_allowed,
        .schema = s->tool_spec ? s->tool_spec : s->req.schema,
        .n_schema = (uint32_t)(s->tool_spec ? strlen(s->tool_spec) : s->req.n_schema),
    };
    gen_think_tokens(s, s->req.kind == REQ_CHAT, &m);
    if (link_gen_open(g->link, &s->lg) != TD_OK)
        return apierr_set(e, 500, NULL, NULL, "%s", err_msg());
    int64_t deadline = gen_now_ms() + g->cfg.timeout_s * 1000;
    metrics_add(&g->metrics.waiting, 1);
    td_err err;
    for (;;) {
        err = link_gen_start(g->link, s->lg, &m);
        if (err != TD_EBUSY || (!s->job && gen_now_ms() >= deadline) || gen_should_end(s))
            break;
        struct timespec ts = {0, GEN_BUSY_RETRY_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    metrics_add(&g->metrics.waiting, -1);
    if (err == TD_OK) {
        s->last_event_ms = gen_now_ms();
        metrics_addu(&g->metrics.prompt_tokens, gp->n);
        metrics_add(&g->metrics.in_flight, 1);
        return TD_OK;
    }
    /* A start that got no answer may still have started: cancel it to be sure. */
    link_gen_close(g->link, s->lg, err == TD_ETIMEOUT || err == TD_ECLOSED);
    s->lg = NULL;
    if (s->cancelled)
        return apierr_set(e, 499, NULL, NULL, "the response was cancelled");
    if (s->client_gone)
        return apierr_set(e, 499, NULL, NULL, "the client went away");
    switch (err) {
    case TD_ERANGE:
        return apierr_set(e, 400, "context_length_exceeded",
                          req_prompt_param(&s->req), "%s", err_msg());
    case TD_EINVAL:
        return apierr_set(e, 400, "invalid_request", NULL, "%s", err_msg());
    case TD_EBUSY:
        return apierr_set(e, 503, "server_busy", NULL,
                          "The server is busy: no sequence slot became free within %lld s.",
                          (long long)g->cfg.timeout_s);
    case TD_ETIMEOUT:
    case TD_ECLOSED:
        return apierr_set(e, 503, "backend_unavailable", NULL,
                          "The model server (verifyd) did not answer: %s", err_msg());
    default:
        return apierr_set(e, 500, "internal_error", NULL, "starting the generation failed: %s",
                          err_msg());
    }
}

/* --- turning events into replies ------------------------------------------------------------ */

void gen_oom(api_stream *s)
{
    if (!s->failed) {
        s->failed = true;
        apierr_set(&s->err, 500, "internal_error", NULL, "the gateway ran out of memory");
    }
}

void gen_sse_put(api_stream *s, char *chunk)
{
    if (!chunk || !tbuf_put(&s->sse, chunk, strlen(chunk)))
        gen_oom(s);
    free(chunk);
}

/* The usage so far for continuous_usage_stats: the finished choices' and the running one's. */
/* The running choice's tokens, steps and (for a prompt's first candidate: the later ones find
 * the prompt cached by it) cached tokens, added to u. */
static void gen_add_counts(const api_stream *s, gw_usage *u)
{
    u->completion_tokens += s->usage.completion_tokens;
    u->steps += s->usage.steps;
    if (s->rc.index % s->req.best_of == 0)
        u->cached_tokens += s->usage.cached_tokens;
}

static void gen_live(api_stream *s)
{
    s->live = s->total;
    if (!s->counted)
        gen_add_counts(s, &s->live);
}

static void gen_role_chunk(api_stream *s)
{
    if (s->sent_role || s->req.kind != REQ_CHAT)
        return;
    s->sent_role = true;
    if (s->req.responses) {
        resp_begin(s);
        return;
    }
    gen_live(s);
    gen_sse_put(s, render_chat_chunk(&s->rc,
                                     json_pack("{s:s,s:s}", "role", "assistant", "content", ""),
                                     NULL, NULL));
}

/* The logprobs waiting for the next chunk, in the shape of the request's endpoint. */
static json_t *gen_take_lp(api_stream *s)
{
    json_t *lp = s->lp_pending;
    s->lp_pending = NULL;
    return lp && s->req.kind == REQ_CHAT ? lp_chat_object(lp) : lp;
}

/* The chunks or accumulated text of the pieces the output produced. */
static void gen_take_pieces(api_stream *s)
{
    gw_output *o = &s->out;
    gen_live(s);
    for (size_t i = 0; i < o->n_pieces; i++) {
        const out_piece *p = &o->pieces[i];
        if (s->any_call && !s->req.parallel_calls)
            break; /* one call asked for: nothing after it is the answer */
        if (p->kind == OUT_TOOL_CALL) {
            s->any_call = true;
            metrics_addu(&s->g->metrics.tool_calls, 1);
        }
        if (s->req.responses) { /* the logprobs so far ride on a message's text */
            json_t *lp = p->kind == OUT_CONTENT ? s->lp_pending : NULL;
            if (lp)
                s->lp_pending = NULL;
            resp_piece(s, p, lp);
            continue;
        }
        if (s->stream) {
            /* a begun call's end adds only the arguments not yet sent, if any */
            if (p->kind == OUT_TOOL_CALL && p->call.streamed &&
                !p->call.arguments[p->call.streamed])
                continue;
            /* A step's logprobs ride on its first text chunk. */
            const bool text = p->kind == OUT_CONTENT || p->kind == OUT_REASONING;
            json_t *lp = text ? gen_take_lp(s) : NULL;
            if (s->req.kind == REQ_CHAT)
                gen_sse_put(s, render_chat_chunk(&s->rc, render_delta(&s->rc, p), NULL, lp));
            else
                gen_sse_put(s, render_completion_chunk(&s->rc, p->text, p->len, NULL, lp));
            continue;
        }
        bool ok = true;
        if (p->kind == OUT_CALL_OPEN || p->kind == OUT_CALL_ARGS)
            continue; /* the whole call follows */
        if (p->kind == OUT_CONTENT)
            ok = tbuf_put(&s->content, p->text, p->len);
        else if (p->kind == OUT_REASONING) {
            ok = tbuf_put(&s->reasoning, p->text, p->len);
            s->has_reasoning = true;
        } else {
            if (!s->calls)
                s->calls = json_array();
            ok = s->calls && json_array_append_new(s->calls, render_tool_call(&s->rc, p)) == 0;
        }
        if (!ok)
            gen_oom(s);
    }
    output_clear(o);
}

/* Token id's log probability from verifyd, with at most top of its alternatives. */
static void gen_lp_token(uint32_t top, uint32_t id, const msg_logprob *m, lp_token *t)
{
    memset(t, 0, sizeof *t);
    t->id = (int32_t)id;
    t->logprob = m->logprob;
    t->rank = m->rank;
    t->n_top = m->n_top < top ? m->n_top : top;
    for (uint32_t k = 0; k < t->n_top; k++) {
        t->top[k].id = (int32_t)m->top_id[k];
        t->top[k].logprob = m->top_logprob[k];
    }
}

static void gen_fail(api_stream *s, int status, const char *code, const char *fmt,
                     const char *msg);

/* A PROMPT event: the next prompt tokens' log probabilities, kept for every choice's echo. */
static void gen_prompt_logprobs(api_stream *s, const link_event *ev)
{
    gen_prompt *gp = gen_cur(s);
    if (!gp->plp || ev->n_logprobs != ev->n_tokens)
        return;
    for (uint32_t i = 0; i < ev->n_tokens; i++) {
        if (gp->n_plp >= gp->n || ev->tokens[i] != (uint32_t)gp->ids[gp->n_plp]) {
            gen_fail(s, 500, "internal_error", "%s",
                     "The model server's prompt log probabilities do not follow the prompt.");
            return;
        }
        gen_lp_token(gen_prompt_top(&s->req), ev->tokens[i], &ev->logprobs[i],
                     &gp->plp[gp->n_plp++]);
    }
}

/* Whether verifyd sent the log probability of every prompt token after the first; the
 * request fails when not. */
static bool gen_plp_whole(api_stream *s, const gen_prompt *gp)
{
    if (gp->n_plp == gp->n)
        return true;
    char msg[160];
    snprintf(msg, sizeof msg, "The model server sent the log probabilities of %zu of the "
             "prompt's %zu tokens.", gp->n_plp - 1, gp->n - 1);
    gen_fail(s, 500, "internal_error", "%s", msg);
    return false;
}

/* echo: the prompt opens the choice's text (a stream's first chunk), with its tokens' log
 * probabilities when asked for. False when the request failed. */
static bool gen_echo(api_stream *s)
{
    if (!s->req.echo || s->echoed)
        return !s->failed;
    s->echoed = true;
    const gen_prompt *gp = gen_cur(s);
    if (s->req.kind == REQ_CHAT) { /* the assistant's last message opens the content */
        if (gp->echo_len == 0)
            return !s->failed;
        if (s->stream) {
            gen_role_chunk(s);
            gen_live(s);
            gen_sse_put(s, render_chat_chunk(&s->rc,
                                             json_pack("{s:s%}", "content", gp->echo,
                                                       gp->echo_len),
                                             NULL, NULL));
        } else if (!tbuf_put(&s->content, gp->echo, gp->echo_len)) {
            gen_oom(s);
        }
        return !s->failed;
    }
    json_t *lp = NULL;
    if (gp->plp && s->req.logprobs) {
        if (!gen_plp_whole(s, gp))
            return false;
        /* prompt_logprobs may have asked for more alternatives than logprobs: a copy cut */
        const bool trim = gen_prompt_top(&s->req) > s->req.top_logprobs;
        lp_token *cut = trim ? malloc(gp->n * sizeof *cut) : NULL;
        for (size_t i = 0; cut && i < gp->n; i++) {
            cut[i] = gp->plp[i];
            if (cut[i].n_top > s->req.top_logprobs)
                cut[i].n_top = s->req.top_logprobs;
        }
        const lp_token *t = trim ? cut : gp->plp;
        lp = t ? lp_completion_object() : NULL;
        const td_err e = lp ? lp_append_completion(lp, s->g->tok, t, gp->n, &s->text_offset)
                            : TD_ENOMEM;
        free(cut);
        if (e != TD_OK) {
            json_decref(lp);
            gen_oom(s);
            return false;
        }
    }
    if (s->stream) {
        gen_live(s);
        gen_sse_put(s, render_completion_chunk(&s->rc, gp->echo, gp->echo_len, NULL, lp));
    } else {
        s->lp = lp;
        if (!tbuf_put(&s->content, gp->echo, gp->echo_len))
            gen_oom(s);
    }
    return !s->failed;
}

static void gen_logprobs(api_stream *s, const link_event *ev, size_t used)
{
    if (!s->req.logprobs || ev->n_logprobs != ev->n_tokens || used == 0)
        return;
    lp_token *t = calloc(used, sizeof *t);
    if (!t) {
        gen_oom(s);
        return;
    }
    for (size_t i = 0; i < used; i++)
        gen_lp_token(s->req.top_logprobs, ev->tokens[i], &ev->logprobs[i], &t[i]);
    /* Streams keep them for the next chunk; whole replies gather them all. */
    json_t **dst = s->stream || s->req.responses ? &s->lp_pending : &s->lp;
    if (!*dst)
        *dst = s->req.kind == REQ_CHAT ? json_array() : lp_completion_object();
    td_err e = !*dst                       ? TD_ENOMEM
               : s->req.kind == REQ_CHAT ? lp_append_chat(*dst, s->g->tok, t, used)
                                         : lp_append_completion(*dst, s->g->tok, t, used,
                                                                &s->text_offset);
    free(t);
    if (e != TD_OK)
        gen_oom(s);
}

/* The choice's object of a whole reply, into s->choices. */
static void gen_keep_choice(api_stream *s)
{
    json_t *lp = s->lp, *ch;
    s->lp = NULL;
    if (s->req.kind == REQ_CHAT) {
        if (lp)
            lp = lp_chat_object(lp);
        /* With tool calls and nothing else said, content is null as OpenAI has it. */
        bool null_content = s->any_call && s->content.len == 0;
        ch = render_chat_choice(&s->rc, null_content ? NULL : s->content.p ? s->content.p : "",
                                s->content.len, s->has_reasoning ? s->reasoning.p : NULL,
                                s->reasoning.len, s->calls, s->finish, lp);
        s->calls = NULL;
    } else {
        ch = render_completion_choice(&s->rc, s->content.p, s->content.len, s->finish, lp);
    }
    if (s->req.prompt_lp) { /* a chat's go beside the choices, a completion's in each */
        const gen_prompt *gp = gen_cur(s);
        if (!gen_plp_whole(s, gp)) {
            json_decref(ch);
            return;
        }
        json_t *pl = s->req.kind == REQ_CHAT
                         ? NULL
                         : lp_prompt_list(s->g->tok, gp->plp, gp->n, s->req.prompt_top);
        if (s->req.kind != REQ_CHAT && (!pl || json_object_set_new(ch, "prompt_logprobs", pl)))
            gen_oom(s);
    }
    if (!s->choices)
        s->choices = json_array();
    if (!ch || !s->choices || json_array_append_new(s->choices, ch) != 0)
        gen_oom(s);
    if (s->scores) /* no token: ranked last */
        s->scores[s->rc.index] = s->usage.completion_tokens
                                     ? s->lp_sum / s->usage.completion_tokens
                                     : -INFINITY;
}

/* best_of > n: of each prompt's best_of candidates, the n of the highest log probability per
 * token, best first (the earlier of two equal ones), numbered prompt by prompt. */
static json_t *gen_best(api_stream *s)
{
    const uint32_t n = s->req.n, b = s->req.best_of, m = (uint32_t)json_array_size(s->choices);
    json_t *best = json_array();
    bool *taken = calloc(m ? m : 1, 1);
    for (uint32_t p = 0; best && taken && p * b < m; p++) {
        const uint32_t lo = p * b, hi = lo + b < m ? lo + b : m;
        for (uint32_t k = 0; best && k < n && lo + k < hi; k++) {
            uint32_t pick = hi;
            for (uint32_t i = lo; i < hi; i++)
                if (!taken[i] && (pick == hi || s->scores[i] > s->scores[pick]))
                    pick = i;
            taken[pick] = true;
            json_t *ch = json_array_get(s->choices, pick);
            if (json_object_set_new(ch, "index", json_integer(p * n + k)) != 0 ||
                json_array_append(best, ch) != 0) {
                json_decref(best);
                best = NULL;
            }
        }
    }
    free(taken);
    json_decref(s->choices);
    s->choices = NULL;
    return best;
}

/* The next choice's fresh state (the last one's lg is closed). */
static void gen_choice_reset(api_stream *s)
{
    output_free(&s->out);
    output_init(&s->out, s->g->tok, &s->oo);
    s->content.len = s->reasoning.len = 0;
    s->has_reasoning = s->any_call = s->sent_role = false;
    json_decref(s->calls);
    json_decref(s->lp);
    json_decref(s->lp_pending);
    s->calls = s->lp = s->lp_pending = NULL;
    s->text_offset = 0;
    s->finish = NULL;
    s->lp_sum = 0;
    s->echoed = s->counted = false;
    s->usage = (gw_usage){0};
    gen_hex(s->call_ids, 8);
    s->rc.index++;
}

/* The request failed: a stream ends with the error event. */
static void gen_end_failed(api_stream *s)
{
    s->done = true;
    metrics_addu(&s->g->metrics.generation_errors, 1);
    if (s->req.responses) {
        resp_failed(s);
    } else if (s->stream) {
        gen_sse_put(s, render_sse_error(&s->err));
        tbuf_put(&s->sse, RENDER_SSE_DONE, strlen(RENDER_SSE_DONE));
    }
}

/* The choice's generation ended (or failed): its final chunk or its object of the whole reply,
 * then the next choice, or the end of the request. */
static void gen_finish(api_stream *s, const char *finish)
{
    gw_state *g = s->g;
    if (s->done)
        return;
    if (s->lg) {
        /* A stop string, a client gone or an error: verifyd may still be generating. */
        link_gen_close(g->link, s->lg, true);
        s->lg = NULL;
        metrics_add(&g->metrics.in_flight, -1);
    }
    metrics_addu(&g->metrics.generations, 1);
    metrics_addu(&g->metrics.cached_tokens, s->usage.cached_tokens);
    if (s->failed) {
        gen_end_failed(s);
        return;
    }
    if (output_finish(&s->out) != TD_OK)
        gen_oom(s);
    gen_take_pieces(s);
    s->finish = s->any_call && strcmp(finish, "stop") == 0 ? "tool_calls" : finish;
    gen_add_counts(s, &s->total);
    const uint32_t rejected = s->predict.n > s->usage.accepted_prediction /* not the output */
                                  ? (uint32_t)s->predict.n - s->usage.accepted_prediction
                                  : 0;
    s->total.accepted_prediction += s->usage.accepted_prediction;
    s->total.rejected_prediction += rejected;
    metrics_addu(&g->metrics.prediction_accepted, s->usage.accepted_prediction);
    metrics_addu(&g->metrics.prediction_rejected, rejected);
    s->counted = true;
    gen_live(s);
    if (s->req.responses)
        resp_end(s, s->finish);
    else if (!s->stream)
        gen_keep_choice(s);
    else if (s->req.kind == REQ_CHAT)
        gen_sse_put(s, render_chat_chunk(&s->rc, NULL, s->finish, gen_take_lp(s)));
    else
        gen_sse_put(s, render_completion_chunk(&s->rc, "", 0, s->finish, gen_take_lp(s)));
    if (!s->client_gone && !s->failed && s->rc.index + 1 < s->n_gens) {
        gen_choice_reset(s);
        if (gen_start(s, &s->err) != TD_OK) {
            s->failed = true;
            gen_end_failed(s);
            return;
        }
        gen_role_chunk(s);
        return;
    }
    s->done = true;
    if (s->failed) {
        gen_end_failed(s);
        return;
    }
    if (!s->stream || s->req.responses)
        return;
    if (s->req.include_usage)
        gen_sse_put(s, s->req.kind == REQ_CHAT ? render_chat_usage_chunk(&s->rc, &s->total)
                                               : render_completion_usage_chunk(&s->rc, &s->total));
    if (!tbuf_put(&s->sse, RENDER_SSE_DONE, strlen(RENDER_SSE_DONE)))
        gen_oom(s);
}

static void gen_fail(api_stream *s, int status, const char *code, const char *fmt, const char *msg)
{
    s->failed = true;
    apierr_set(&s->err, status, code, NULL, fmt, msg);
    gen_finish(s, "stop");
}

/* Waits up to wait_ms for one event and handles it. */
static void gen_step(api_stream *s, int32_t wait_ms)
{
    gw_state *g = s->g;
    if (s->done)
        return;
    if (gen_should_end(s)) {
        metrics_addu(&g->metrics.cancelled, 1);
        gen_finish(s, "stop");
        return;
    }
    link_event ev;
    td_err e = link_gen_next(s->lg, wait_ms, &ev);
    if (e == TD_ETIMEOUT) {
        if (gen_now_ms() - s->last_event_ms > g->cfg.timeout_s * 1000)
            gen_fail(s, 503, "backend_timeout", "%s",
                     "The model server (verifyd) sent nothing for too long.");
        return;
    }
    s->last_event_ms = gen_now_ms();
    s->usage.cached_tokens = ev.usage.cached_tokens;
    s->usage.steps = ev.usage.steps;
    s->usage.accepted_prediction = s->predict.n ? ev.usage.predicted_tokens : 0;
    if (ev.kind == MSG_EVENT_ERROR) {
        int status = ev.code == TD_ECLOSED || ev.code == TD_EBUSY ? 503
                     : ev.code == TD_ERANGE || ev.code == TD_EINVAL ? 400
                                                                    : 500;
        const char *code = status == 503 ? "backend_unavailable" : status == 400 ? "invalid_request"
                                                                                 : "internal_error";
        gen_fail(s, status, code, "The generation failed: %s", ev.message);
        link_event_free(&ev);
        return;
    }
    if (ev.kind == MSG_EVENT_PROMPT || !gen_echo(s)) {
        if (ev.kind == MSG_EVENT_PROMPT)
            gen_prompt_logprobs(s, &ev);
        link_event_free(&ev);
        return;
    }
    size_t used = 0;
    if (ev.n_tokens) {
        /* Token ids travel as u32; the tokenizer refuses any outside its vocabulary. */
        if (output_push(&s->out, (const int32_t *)ev.tokens, ev.n_tokens, &used) != TD_OK) {
            char msg[1100];
            snprintf(msg, sizeof msg, "%s", err_msg());
            link_event_free(&ev);
            gen_fail(s, 500, "internal_error", "Decoding the output failed: %s", msg);
            return;
        }
        s->usage.completion_tokens += (uint32_t)used;
        metrics_tokens(&g->metrics, used);
        for (size_t i = 0; s->scores && ev.n_logprobs == ev.n_tokens && i < used; i++)
            s->lp_sum += ev.logprobs[i].logprob;
        gen_logprobs(s, &ev, used);
        gen_take_pieces(s);
    }
    msg_finish fin = ev.finish;
    msg_event_kind kind = ev.kind;
    link_event_free(&ev);
    if (s->out.stopped || (s->any_call && !s->req.parallel_calls))
        gen_finish(s, "stop");
    else if (kind == MSG_EVENT_DONE)
        gen_finish(s, fin == MSG_FINISH_LENGTH ? "length" : "stop");
}

void gen_run(api_stream *s, void (*after)(api_stream *s, void *arg), void *arg)
{
    api_error e;
    if (gen_start(s, &e) != TD_OK) {
        if (s->cancelled) {
            s->done = true; /* cancelled while waiting for verifyd: nothing ran */
        } else {
            s->failed = true;
            s->err = e;
            gen_end_failed(s);
        }
        after(s, arg);
        return;
    }
    resp_started(s);
    after(s, arg);
    while (!s->done) {
        gen_step(s, GEN_WAIT_MS);
        after(s, arg);
    }
}

/* --- the whole reply -------------------------------------------------------------------------- */

static void gen_reply_body(api_stream *s, api_reply *r)
{
    if (s->client_gone) {
        apierr_set(&s->err, 499, NULL, NULL, "the client went away");
        gen_reply_error(r, &s->err);
        return;
    }
    if (s->failed) {
        gen_reply_error(r, &s->err);
        return;
    }
    if (s->req.responses) {
        r->body = resp_body(s, s->finish);
    } else {
        json_t *choices = s->scores ? gen_best(s) : s->choices;
        s->choices = NULL;
        json_t *plp = NULL; /* a chat's prompt_logprobs (gen_keep_choice checked them whole) */
        if (s->req.kind == REQ_CHAT && s->req.prompt_lp &&
            !(plp = lp_prompt_list(s->g->tok, s->prompts[0].plp, s->prompts[0].n,
                                   s->req.prompt_top))) {
            json_decref(choices);
            choices = NULL; /* out of memory, below */
        }
        r->body = s->req.kind == REQ_CHAT
                      ? render_chat_response(&s->rc, choices, &s->total, plp)
                      : render_completion_response(&s->rc, choices, &s->total);
    }
    if (!r->body) {
        apierr_set(&s->err, 500, "internal_error", NULL, "the gateway ran out of memory");
        gen_reply_error(r, &s->err);
        return;
    }
    r->status = 200;
    r->content_type = "application/json";
    r->body_len = strlen(r->body);
}

void api_stream_free(api_stream *s)
{
    if (!s)
        return;
    if (s->follow) {
        bg_unfollow(s);
        free(s);
        return;
    }
    if (s->lg) {
        if (!s->done)
            metrics_addu(&s->g->metrics.cancelled, 1);
        link_gen_close(s->g->link, s->lg, true);
        metrics_add(&s->g->metrics.in_flight, -1);
    }
    if (s->out_ready)
        output_free(&s->out);
    for (size_t i = 0; s->prompts && i < s->n_prompts; i++) {
        free(s->prompts[i].ids);
        free(s->prompts[i].echo_owned);
        free(s->prompts[i].plp);
    }
    free(s->prompts);
    req_free(&s->req);
    free(s->content.p);
    free(s->reasoning.p);
    free(s->sse.p);
    json_decref(s->calls);
    json_decref(s->lp);
    json_decref(s->lp_pending);
    json_decref(s->choices);
    free(s->scores);
    free(s->tool_spec);
    tok_ids_free(&s->predict);
    free(s->bad);
    resp_free(&s->rs);
    free(s);
}

ssize_t api_stream_read(api_stream *s, char *buf, size_t cap)
{
    if (s->follow)
        return bg_read(s, buf, cap);
    gen_role_chunk(s);
    while (s->sse_off == s->sse.len) {
        s->sse_off = s->sse.len = 0;
        if (s->client_gone)
            return -1;
        if (s->done)
            return 0; /* everything, [DONE] included, was read */
        gen_step(s, GEN_WAIT_MS);
        if (s->client_gone)
            return -1;
    }
    size_t n = s->sse.len - s->sse_off;
    if (n > cap)
        n = cap;
    memcpy(buf, s->sse.p + s->sse_off, n);
    s->sse_off += n;
    return (ssize_t)n;
}

void gen_handle(gw_state *g, const api_call *c, req_kind kind, api_reply *r)
{
    api_error e;
    api_stream *s = calloc(1, sizeof *s);
    if (!s) {
        apierr_set(&e, 500, "internal_error", NULL, "the gateway ran out of memory");
        gen_reply_error(r, &e);
        return;
    }
    s->g = g;
    s->client_fd = c->client_fd;
    const td_err parsed = kind == REQ_RESPONSES
                              ? req_parse_responses(&s->req, c->body, c->body_len, g->responses, &e)
                              : req_parse(&s->req, kind, c->body, c->body_len, &e);
    kind = s->req.kind;
    if (parsed != TD_OK) {
        gen_reply_error(r, &e);
        api_stream_free(s);
        return;
    }
    /* No model, or an empty name, means the one this server serves. */
    if (s->req.model && s->req.model[0] && strcmp(s->req.model, g->model_name) != 0) {
        apierr_set(&e, 400, "model_not_found", "model",
                   "The model '%s' does not exist; this server serves '%s'.", s->req.model,
                   g->model_name);
        gen_reply_error(r, &e);
        api_stream_free(s);
        return;
    }
    td_err err = gen_prompts(s, &e);
    if (err == TD_OK)
        err = gen_check_ids(s, "logit_bias", s->req.bias_tok, s->req.n_bias, &e);
    if (err == TD_OK)
        err = gen_check_ids(s, "stop_token_ids", s->req.stop_ids, s->req.n_stop_ids, &e);
    if (err == TD_OK)
        err = gen_check_ids(s, "allowed_token_ids", s->req.allowed, s->req.n_allowed, &e);
    s->oo = (output_opts){
        .stops = s->req.stop,
        .stop_lens = s->req.stop_len,
        .n_stops = s->req.n_stop,
        .reasoning = kind == REQ_CHAT,
        .in_think = s->in_think,
        .tools = s->req.parse_tools ? s->req.tools : NULL,
        .keep_stop = s->req.keep_stop,
        .keep_special = s->req.keep_special,
        .stream_calls = s->req.stream,
    };
    if (err == TD_OK)
        err = gen_tool_spec(s, &e);
    if (err == TD_OK && s->req.prediction)
        err = gen_prediction(s, &e);
    if (err == TD_OK && s->req.bad_words)
        err = gen_bad_words(s, &e);
    s->oo.calls_matched = s->tool_spec != NULL;
    if (err == TD_OK && s->req.responses && !(s->rs.items = json_array()))
        err = apierr_set(&e, 500, "internal_error", NULL, "the gateway ran out of memory");
    if (err == TD_OK && s->req.best_of > s->req.n &&
        !(s->scores = calloc(s->n_gens, sizeof *s->scores)))
        err = apierr_set(&e, 500, "internal_error", NULL, "the gateway ran out of memory");
    if (err == TD_OK) {
        output_init(&s->out, g->tok, &s->oo);
        s->out_ready = true;
        if (!s->req.background)
            err = gen_start(s, &e);
    }
    if (err != TD_OK) {
        gen_reply_error(r, &e);
        api_stream_free(s);
        return;
    }
    snprintf(s->id, sizeof s->id, "%s",
             s->req.responses ? "resp_" : kind == REQ_CHAT ? "chatcmpl-" : "cmpl-");
    gen_hex(s->id + strlen(s->id), 12);
    gen_hex(s->call_ids, 8);
    s->rc = (render_ctx){.id = s->id, .created = (int64_t)time(NULL), .model = g->model_name,
                         .usage_null = s->req.stream && s->req.include_usage,
                         .live_usage = s->req.continuous_usage ? &s->live : NULL,
                         .call_ids = s->call_ids};
    for (size_t i = 0; i < s->n_prompts; i++)
        s->total.prompt_tokens += (uint32_t)s->prompts[i].n;
    s->total.predicted = s->req.prediction != NULL;
    s->stream = s->req.stream;
    if (s->req.background) {
        bg_start(s, r); /* its own thread runs it */
        return;
    }
    if (s->stream) {
        r->status = 200;
        r->content_type = "text/event-stream";
        r->stream = s;
        return;
    }
    while (!s->done)
        gen_step(s, GEN_WAIT_MS);
    gen_reply_body(s, r);
    api_stream_free(s);
}
