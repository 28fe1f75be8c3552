#include "tests/support/fake_verifyd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nng/nng.h>
#include <nng/protocol/pipeline0/push.h>

#include "common/bus.h"

#define FAKE_GENS_MAX 64

struct fake_verifyd {
    bus_server *server;
    nng_socket push;
    uint32_t pid, n_ctx;
    bool ready;
    char not_ready[MSG_ERROR_MAX + 1]; /* status: why not ready */
    pthread_mutex_t mu;
    fake_script script;
    int busy_left;
    int starts, cancels;
    uint64_t cancelled[FAKE_GENS_MAX]; /* seq ids cancelled (ring) */
    int n_cancelled;
    bool have_start;
    msg_gen_start last;                /* arrays below */
    uint32_t last_prompt[MSG_PROMPT_MAX > 4096 ? 4096 : MSG_PROMPT_MAX];
    uint32_t last_stop[MSG_STOP_MAX];
    uint32_t last_predict[256];        /* the prediction, cut to fit */
    uint32_t last_bad[512];            /* the bad words, cut to fit */
    char last_schema[4096];            /* the schema, cut to fit */
    int running;                       /* generation threads alive */
    bool stopping;
};

typedef struct fake_gen {
    fake_verifyd *f;
    uint64_t seq;
    fake_script s;
    uint32_t n_prompt, max_tokens;
    uint32_t *prompt;  /* [n_prompt] with prompt_lp, else NULL */
    bool prompt_lp;
    bool logprobs;
    uint32_t top;
    float lp_shift; /* -lp_per_seed * (15 - seed % 16) */
} fake_gen;

float fake_logprob(uint32_t i, uint32_t k)
{
    return -0.25f * (float)(i + 1) - 1.0f * (float)k;
}

float fake_prompt_logprob(uint32_t i, uint32_t k)
{
    return -0.5f * (float)i - 2.0f * (float)k;
}

static void fake_sleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool fake_is_cancelled(fake_verifyd *f, uint64_t seq)
{
    pthread_mutex_lock(&f->mu);
    bool c = f->stopping;
    for (int i = 0; i < f->n_cancelled && i < FAKE_GENS_MAX; i++)
        c = c || f->cancelled[i] == seq;
    pthread_mutex_unlock(&f->mu);
    return c;
}

static void fake_push(fake_verifyd *f, const msg_gen_event *ev)
{
    msg_buf b;
    msg_buf_init(&b);
    if (msg_pack_gen_event(&b, 0, ev) == TD_OK)
        nng_send(f->push, b.data, b.len, 0);
    msg_buf_free(&b);
}

static void *fake_gen_main(void *arg)
{
    fake_gen *g = arg;
    fake_verifyd *f = g->f;
    uint32_t n = g->s.n_tokens < g->max_tokens ? g->s.n_tokens : g->max_tokens;
    uint32_t sent = 0, steps = 0;
    msg_logprob lps[64];
    /* the prompt's tokens from the second on, 16 per PROMPT event */
    uint32_t n_plp = g->prompt_lp && g->n_prompt > 1 + g->s.prompt_lp_drop
                         ? g->n_prompt - 1 - g->s.prompt_lp_drop
                         : 0;
    for (uint32_t at = 0; at < n_plp; at += 16) {
        uint32_t k = n_plp - at < 16 ? n_plp - at : 16;
        for (uint32_t i = 0; i < k; i++) {
            uint32_t pos = 1 + at + i;
            memset(&lps[i], 0, sizeof lps[i]);
            lps[i].logprob = fake_prompt_logprob(pos, 0);
            lps[i].rank = pos + 1; /* the token is its own first alternative: rank 1 there */
            lps[i].n_top = g->top;
            for (uint32_t t = 0; t < g->top; t++) {
                lps[i].top_id[t] = g->prompt[pos] + t;
                lps[i].top_logprob[t] = fake_prompt_logprob(pos, t);
            }
        }
        msg_gen_event ev = {.seq_id = g->seq, .kind = MSG_EVENT_PROMPT,
                            .tokens = g->prompt + 1 + at, .n_tokens = k, .logprobs = lps,
                            .n_logprobs = k, .usage = {.prompt_tokens = g->n_prompt}};
        fake_push(f, &ev);
    }
    while (sent < n) {
        fake_sleep(g->s.delay_ms);
        if (fake_is_cancelled(f, g->seq))
            goto out;
        if (g->s.error_after > 0 && (int)steps == g->s.error_after) {
            msg_gen_event ev = {.seq_id = g->seq, .kind = MSG_EVENT_ERROR,
                                .finish = MSG_FINISH_ERROR, .code = TD_EIO};
            snprintf(ev.message, sizeof ev.message, "scripted failure");
            fake_push(f, &ev);
            goto out;
        }
        uint32_t k = n - sent < g->s.step ? n - sent : g->s.step;
        for (uint32_t i = 0; g->logprobs && i < k && i < 64; i++) {
            memset(&lps[i], 0, sizeof lps[i]);
            lps[i].logprob = fake_logprob(sent + i, 0) + g->lp_shift;
            lps[i].n_top = g->top;
            for (uint32_t t = 0; t < g->top; t++) {
                lps[i].top_id[t] = g->s.tokens[sent + i] + t;
                lps[i].top_logprob[t] = fake_logprob(sent + i, t) + g->lp_shift;
            }
        }
        steps++;
        msg_gen_event ev = {.seq_id = g->seq, .kind = MSG_EVENT_TOKEN, .tokens = g->s.tokens + sent,
                            .n_tokens = k, .logprobs = g->logprobs ? lps : NULL,
                            .n_logprobs = g->logprobs ? k : 0, .finish = MSG_FINISH_NONE,
                            .usage = {.prompt_tokens = g->n_prompt,
                                      .completion_tokens = sent + k,
                                      .steps = steps,
                                      .cached_tokens = g->s.cached,
                                      .predicted_tokens = g->s.predicted}};
        fake_push(f, &ev);
        sent += k;
    }
    if (g->s.hang)
        goto out;
    fake_sleep(g->s.delay_ms);
    msg_gen_event done = {.seq_id = g->seq, .kind = MSG_EVENT_DONE,
                          .finish = g->s.n_tokens > g->max_tokens ? MSG_FINISH_LENGTH
                                                                   : MSG_FINISH_STOP,
                          .usage = {.prompt_tokens = g->n_prompt, .completion_tokens = sent,
                                    .steps = steps, .cached_tokens = g->s.cached,
                                      .predicted_tokens = g->s.predicted}};
    if (!fake_is_cancelled(f, g->seq))
        fake_push(f, &done);
out:
    pthread_mutex_lock(&f->mu);
    f->running--;
    pthread_mutex_unlock(&f->mu);
    free(g->prompt);
    free(g);
    return NULL;
}

static td_err fake_handle(void *user, const uint8_t *req, size_t len, msg_buf *reply)
{
    fake_verifyd *f = user;
    msg_header h;
    uint64_t rid;
    TD_TRY(msg_unpack_header(req, len, &h));
    switch (h.type) {
    case MSG_HELLO: {
        pthread_mutex_lock(&f->mu);
        msg_hello m = {.role = MSG_ROLE_VERIFYD, .pid = f->pid, .protocol = MSG_PROTOCOL_VERSION};
        pthread_mutex_unlock(&f->mu);
        return msg_pack_hello(reply, h.request_id, &m);
    }
    case MSG_STATUS_GET: {
        msg_status st = {.n_ctx = f->n_ctx, .n_vocab = 512, .ready = f->ready, .block = 16,
                         .slots = 4, .n_hist = 3, .accept_hist = {0, 5, 2}, .steps = 7,
                         .completion_tokens = 9, .verify_us = 3000000, .draft_us = 1500000,
                         .draft_attaches = 2, .queued = 1, .graph_recorded = 3,
                         .graph_replayed = 40, .graph_direct = 4};
        snprintf(st.model, sizeof st.model, "fake");
        pthread_mutex_lock(&f->mu);
        st.ready = f->ready;
        snprintf(st.not_ready, sizeof st.not_ready, "%s", f->ready ? "" : f->not_ready);
        pthread_mutex_unlock(&f->mu);
        return msg_pack_status(reply, h.request_id, &st);
    }
    case MSG_GEN_CANCEL: {
        msg_gen_cancel c;
        TD_TRY(msg_unpack_gen_cancel(req, len, &rid, &c));
        pthread_mutex_lock(&f->mu);
        f->cancels++;
        f->cancelled[f->n_cancelled++ % FAKE_GENS_MAX] = c.seq_id;
        pthread_mutex_unlock(&f->mu);
        msg_ack a = {.id = c.seq_id};
        return msg_pack_ack(reply, rid, &a);
    }
    case MSG_GEN_START: {
        msg_gen_start m;
        TD_TRY(msg_unpack_gen_start(req, len, &rid, &m));
        pthread_mutex_lock(&f->mu);
        f->have_start = true;
        f->last = m;
        uint32_t np = m.n_prompt < 4096 ? m.n_prompt : 4096;
        memcpy(f->last_prompt, m.prompt, np * sizeof *m.prompt);
        if (m.n_stop)
            memcpy(f->last_stop, m.stop, m.n_stop * sizeof *m.stop);
        f->last.prompt = f->last_prompt;
        f->last.stop = f->last_stop;
        snprintf(f->last_schema, sizeof f->last_schema, "%s", m.schema ? m.schema : "");
        f->last.schema = f->last_schema;
        f->last.n_predict = m.n_predict < 256 ? m.n_predict : 256;
        if (f->last.n_predict)
            memcpy(f->last_predict, m.predict, f->last.n_predict * sizeof *m.predict);
        f->last.predict = f->last_predict;
        f->last.n_bad = m.n_bad < 512 ? m.n_bad : 512;
        if (f->last.n_bad)
            memcpy(f->last_bad, m.bad, f->last.n_bad * sizeof *m.bad);
        f->last.bad = f->last_bad;
        td_err refuse = TD_OK;
        if (f->busy_left > 0) {
            f->busy_left--;
            refuse = TD_EBUSY;
        } else if (f->script.start_error != TD_OK) {
            refuse = f->script.start_error;
        }
        fake_gen *g = NULL;
        if (refuse == TD_OK) {
            f->starts++;
            f->running++;
            g = calloc(1, sizeof *g);
            g->f = f;
            g->seq = m.seq_id;
            g->s = f->script;
            g->n_prompt = m.n_prompt;
            g->max_tokens = m.max_tokens;
            if (m.prompt_logprobs && (g->prompt = malloc(m.n_prompt * sizeof *g->prompt)))
                memcpy(g->prompt, m.prompt, m.n_prompt * sizeof *g->prompt);
            g->prompt_lp = g->prompt != NULL;
            g->logprobs = m.logprobs;
            g->top = m.top_logprobs;
            g->lp_shift = -f->script.lp_per_seed * (float)(15 - m.sampler.seed % 16);
        }
        pthread_mutex_unlock(&f->mu);
        uint64_t seq = m.seq_id;
        msg_free_gen_start(&m);
        if (refuse == TD_EBUSY)
            return err_set(TD_EBUSY, "all 4 sequence slots are busy");
        if (refuse != TD_OK)
            return err_set(refuse, "prompt of too many tokens for the context");
        msg_ack a = {.id = seq};
        td_err e = msg_pack_ack(reply, rid, &a);
        pthread_t t;
        pthread_create(&t, NULL, fake_gen_main, g);
        pthread_detach(t);
        return e;
    }
    default:
        return err_set(TD_EPROTO, "fake verifyd: unexpected %s", msg_type_name(h.type));
    }
}

td_err fake_verifyd_start(fake_verifyd **out, const char *verifyd_url, const char *events_url,
                          uint32_t pid, uint32_t n_ctx, bool ready)
{
    fake_verifyd *f = calloc(1, sizeof *f);
    if (!f)
        return err_set(TD_ENOMEM, "fake verifyd: out of memory");
    pthread_mutex_init(&f->mu, NULL);
    f->pid = pid;
    f->n_ctx = n_ctx;
    f->ready = ready;
    f->script.step = 1;
    int rv = nng_push0_open(&f->push);
    if (rv == 0) {
        nng_socket_set_ms(f->push, NNG_OPT_SENDTIMEO, 2000);
        rv = nng_dial(f->push, events_url, NULL, NNG_FLAG_NONBLOCK);
    }
    if (rv != 0) {
        free(f);
        return err_set(TD_EIO, "fake verifyd: push socket: %s", nng_strerror(rv));
    }
    bus_opts o;
    bus_opts_default(&o);
    o.recv_timeout_ms = 100;
    td_err e = bus_server_init(&f->server, verifyd_url, &o, fake_handle, f);
    if (e != TD_OK) {
        nng_close(f->push);
        free(f);
        return e;
    }
    *out = f;
    return TD_OK;
}

void fake_verifyd_stop(fake_verifyd *f)
{
    if (!f)
        return;
    bus_server_free(f->server);
    pthread_mutex_lock(&f->mu);
    f->stopping = true;
    pthread_mutex_unlock(&f->mu);
    for (;;) {
        pthread_mutex_lock(&f->mu);
        int running = f->running;
        pthread_mutex_unlock(&f->mu);
        if (running == 0)
            break;
        fake_sleep(10);
    }
    nng_close(f->push);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

void fake_verifyd_script(fake_verifyd *f, const fake_script *s)
{
    pthread_mutex_lock(&f->mu);
    f->script = *s;
    if (f->script.step == 0)
        f->script.step = 1;
    f->busy_left = s->busy;
    pthread_mutex_unlock(&f->mu);
}

bool fake_verifyd_last_start(fake_verifyd *f, msg_gen_start *m, uint32_t *prompt,
                             uint32_t prompt_cap, uint32_t *stop, uint32_t stop_cap)
{
    pthread_mutex_lock(&f->mu);
    bool have = f->have_start;
    if (have) {
        *m = f->last;
        uint32_t np = m->n_prompt < prompt_cap ? m->n_prompt : prompt_cap;
        memcpy(prompt, f->last_prompt, np * sizeof *prompt);
        uint32_t ns = m->n_stop < stop_cap ? m->n_stop : stop_cap;
        memcpy(stop, f->last_stop, ns * sizeof *stop);
        m->prompt = prompt;
        m->stop = stop;
    }
    pthread_mutex_unlock(&f->mu);
    return have;
}

int fake_verifyd_cancels(fake_verifyd *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->cancels;
    pthread_mutex_unlock(&f->mu);
    return n;
}

int fake_verifyd_starts(fake_verifyd *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->starts;
    pthread_mutex_unlock(&f->mu);
    return n;
}

void fake_verifyd_set_pid(fake_verifyd *f, uint32_t pid)
{
    pthread_mutex_lock(&f->mu);
    f->pid = pid;
    pthread_mutex_unlock(&f->mu);
}

void fake_verifyd_set_ready(fake_verifyd *f, bool ready, const char *why)
{
    pthread_mutex_lock(&f->mu);
    f->ready = ready;
    snprintf(f->not_ready, sizeof f->not_ready, "%s", why ? why : "");
    pthread_mutex_unlock(&f->mu);
}
