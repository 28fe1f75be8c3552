#include "gateway/link.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>

#include "common/bus.h"
#include "common/log.h"

/* The receiver wakes this often to notice link_free. */
#define LINK_RECV_POLL_MS 200
/* ms verifyd has to answer after its event connection closed before it counts as gone. */
#define LINK_LOST_POLL_MS 500

struct link_gen {
    gw_link *link;     /* whose mutex guards this generation */
    uint64_t seq;
    link_event *queue; /* [cap] ring of events not yet taken */
    size_t head;       /* index of the oldest */
    size_t n;          /* events queued */
    size_t cap;        /* ring size */
    bool ended;        /* the last event (DONE or ERROR) is queued: later ones are dropped */
    bool started;      /* verifyd acknowledged gen_start: a lost verifyd ends it */
    pthread_cond_t cv; /* signalled when an event is queued */
    link_gen *next;    /* registry list */
};

struct gw_link {
    link_opts opts;
    bus_client *client;
    nng_socket pull;
    bool pull_open;
    pthread_t rx, poller;
    bool rx_running, poller_running;

    pthread_mutex_t mu;   /* guards everything below and every link_gen */
    pthread_cond_t wake;  /* link_free wakes the poller */
    bool stopping;
    link_gen *gens;       /* open generations */
    msg_status status;    /* verifyd's last answer */
    int64_t status_ms;    /* monotonic ms of that answer, 0 = never */
    uint32_t verifyd_pid; /* from verifyd's hello, 0 = unknown */
    bool pipe_lost;       /* an event connection closed since the last poll */
    uint64_t next_seq;
    uint64_t next_request; /* request ids of control calls */
};

static int64_t link_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void link_event_free(link_event *e)
{
    free(e->tokens);
    free(e->logprobs);
    e->tokens = NULL;
    e->logprobs = NULL;
}

/* --- events ---------------------------------------------------------------------------------- */

/* Queues ev (taking its arrays) on g; the caller holds mu. */
static void link_queue(link_gen *g, link_event *ev)
{
    if (g->ended) {
        link_event_free(ev);
        return;
    }
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        link_event *q = malloc(cap * sizeof *q);
        if (!q) {
            /* Out of memory: end the generation rather than lose an event silently. */
            link_event_free(ev);
            ev->kind = MSG_EVENT_ERROR;
            ev->code = TD_ENOMEM;
            snprintf(ev->message, sizeof ev->message, "gateway out of memory");
            if (g->n > 0) { /* replace the newest event */
                link_event *last = &g->queue[(g->head + g->n - 1) % g->cap];
                link_event_free(last);
                *last = *ev;
            }
            g->ended = true;
            pthread_cond_broadcast(&g->cv);
            return;
        }
        for (size_t i = 0; i < g->n; i++)
            q[i] = g->queue[(g->head + i) % g->cap];
        free(g->queue);
        g->queue = q;
        g->head = 0;
        g->cap = cap;
    }
    g->queue[(g->head + g->n) % g->cap] = *ev;
    g->n++;
    if (msg_event_last(ev->kind))
        g->ended = true;
    pthread_cond_broadcast(&g->cv);
}

static link_gen *link_find(gw_link *l, uint64_t seq)
{
    for (link_gen *g = l->gens; g; g = g->next)
        if (g->seq == seq)
            return g;
    return NULL;
}

/* Ends every started generation with an error event; the caller holds mu. */
static void link_fail_all(gw_link *l, td_err code, const char *why)
{
    for (link_gen *g = l->gens; g; g = g->next) {
        if (!g->started || g->ended)
            continue;
        link_event ev = {.kind = MSG_EVENT_ERROR, .finish = MSG_FINISH_ERROR, .code = code};
        snprintf(ev.message, sizeof ev.message, "%s", why);
        link_queue(g, &ev);
    }
}

static td_err link_copy_event(const msg_gen_event *m, link_event *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = m->kind;
    ev->finish = m->finish;
    ev->usage = m->usage;
    ev->code = m->code;
    snprintf(ev->message, sizeof ev->message, "%s", m->message);
    if (m->n_tokens) {
        ev->tokens = malloc(m->n_tokens * sizeof *ev->tokens);
        if (!ev->tokens)
            return err_set(TD_ENOMEM, "event: out of memory");
        memcpy(ev->tokens, m->tokens, m->n_tokens * sizeof *ev->tokens);
        ev->n_tokens = m->n_tokens;
    }
    if (m->n_logprobs) {
        ev->logprobs = malloc(m->n_logprobs * sizeof *ev->logprobs);
        if (!ev->logprobs) {
            link_event_free(ev);
            return err_set(TD_ENOMEM, "event: out of memory");
        }
        memcpy(ev->logprobs, m->logprobs, m->n_logprobs * sizeof *ev->logprobs);
        ev->n_logprobs = m->n_logprobs;
    }
    return TD_OK;
}

static void *link_rx_main(void *arg)
{
    gw_link *l = arg;
    for (;;) {
        nng_msg *msg = NULL;
        int rv = nng_recvmsg(l->pull, &msg, 0);
        if (rv == NNG_ETIMEDOUT) {
            pthread_mutex_lock(&l->mu);
            bool stop = l->stopping;
            pthread_mutex_unlock(&l->mu);
            if (stop)
                break;
            continue;
        }
        if (rv != 0) {
            if (rv != NNG_ECLOSED)
                LOG_WARN("events: receive failed: %s", nng_strerror(rv));
            break;
        }
        msg_gen_event m;
        uint64_t rid;
        td_err e = msg_unpack_gen_event(nng_msg_body(msg), nng_msg_len(msg), &rid, &m);
        nng_msg_free(msg);
        if (e != TD_OK) {
            LOG_WARN("events: dropped a malformed event: %s", err_msg());
            continue;
        }
        link_event ev;
        e = link_copy_event(&m, &ev);
        uint64_t seq = m.seq_id;
        msg_free_gen_event(&m);
        if (e != TD_OK) {
            LOG_ERROR("events: %s", err_msg());
            continue;
        }
        pthread_mutex_lock(&l->mu);
        link_gen *g = link_find(l, seq);
        if (g)
            link_queue(g, &ev);
        else
            link_event_free(&ev);
        pthread_mutex_unlock(&l->mu);
        if (!g)
            LOG_DEBUG("events: no open generation for sequence %llu", (unsigned long long)seq);
    }
    return NULL;
}

/* --- control calls --------------------------------------------------------------------------- */

static uint64_t link_request_id(gw_link *l)
{
    pthread_mutex_lock(&l->mu);
    uint64_t id = l->next_request++;
    pthread_mutex_unlock(&l->mu);
    return id;
}

/* One call; an MSG_ERROR reply becomes its code and message. *type gets the reply's type. */
static td_err link_call_within(gw_link *l, const msg_buf *req, msg_buf *reply, msg_type *type,
                               int32_t timeout_ms)
{
    TD_TRY(bus_client_call(l->client, req->data, req->len, reply, timeout_ms));
    msg_header h;
    TD_TRY(msg_unpack_header(reply->data, reply->len, &h));
    *type = h.type;
    if (h.type == MSG_ERROR) {
        msg_error me;
        TD_TRY(msg_unpack_error(reply->data, reply->len, NULL, &me));
        return err_set(me.code, "%s", me.message);
    }
    return TD_OK;
}

static td_err link_call(gw_link *l, const msg_buf *req, msg_buf *reply, msg_type *type)
{
    return link_call_within(l, req, reply, type, l->opts.call_ms);
}

/* hello + status_get, each within timeout_ms. A failed hello skips the status call, so a
 * verifyd that is gone costs one timeout per poll. */
static td_err link_poll_once(gw_link *l, msg_status *st, uint32_t *pid, int32_t timeout_ms)
{
    msg_buf req, reply;
    msg_buf_init(&req);
    msg_buf_init(&reply);
    msg_type type;
    msg_hello hello = {.role = MSG_ROLE_GATEWAY, .pid = (uint32_t)getpid(),
                       .protocol = MSG_PROTOCOL_VERSION};
    *pid = 0;
    td_err e = msg_pack_hello(&req, link_request_id(l), &hello);
    if (e == TD_OK)
        e = link_call_within(l, &req, &reply, &type, timeout_ms);
    /* A verifyd that answers hello with an error instead of its own hello is still usable: its
     * pid stays unknown. */
    if (e == TD_OK && type == MSG_HELLO) {
        msg_hello back;
        if (msg_unpack_hello(reply.data, reply.len, NULL, &back) == TD_OK)
            *pid = back.pid;
    }
    if (e == TD_OK || (e != TD_ETIMEOUT && e != TD_ECLOSED))
        e = msg_pack_status_get(&req, link_request_id(l));
    if (e == TD_OK)
        e = link_call_within(l, &req, &reply, &type, timeout_ms);
    if (e == TD_OK && type != MSG_STATUS)
        e = err_set(TD_EPROTO, "verifyd answered status_get with %s", msg_type_name(type));
    if (e == TD_OK)
        e = msg_unpack_status(reply.data, reply.len, NULL, st);
    msg_buf_free(&req);
    msg_buf_free(&reply);
    return e;
}

/* NNG callback: verifyd's event connection closed (it exited or died): poll at once. */
static void link_pipe_removed(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    (void)ev;
    gw_link *l = arg;
    pthread_mutex_lock(&l->mu);
    l->pipe_lost = true;
    pthread_cond_broadcast(&l->wake);
    pthread_mutex_unlock(&l->mu);
}

static void *link_poller_main(void *arg)
{
    gw_link *l = arg;
    bool up = false;
    for (;;) {
        pthread_mutex_lock(&l->mu);
        bool pipe_lost = l->pipe_lost;
        l->pipe_lost = false;
        pthread_mutex_unlock(&l->mu);
        /* After its event connection closed, verifyd gets a short time to prove it lives. */
        int32_t timeout = pipe_lost && LINK_LOST_POLL_MS < l->opts.call_ms ? LINK_LOST_POLL_MS
                                                                           : l->opts.call_ms;
        msg_status st;
        uint32_t pid;
        td_err e = link_poll_once(l, &st, &pid, timeout);
        int64_t now = link_now_ms();
        pthread_mutex_lock(&l->mu);
        if (l->stopping) {
            pthread_mutex_unlock(&l->mu);
            break;
        }
        if (e == TD_OK) {
            if (pid && l->verifyd_pid && pid != l->verifyd_pid) {
                LOG_WARN("verifyd restarted (pid %u -> %u): ending its generations",
                         l->verifyd_pid, pid);
                link_fail_all(l, TD_ECLOSED, "verifyd restarted during the generation");
            } else if (l->status_ms && st.requests < l->status.requests) {
                LOG_WARN("verifyd's counters went back: it restarted; ending its generations");
                link_fail_all(l, TD_ECLOSED, "verifyd restarted during the generation");
            }
            if (pid)
                l->verifyd_pid = pid;
            l->status = st;
            l->status_ms = now;
            if (!up)
                LOG_INFO("verifyd answers: model %s, context %u, %s", st.model, st.n_ctx,
                         st.ready ? "ready" : "loading");
            up = true;
        } else if (up && (pipe_lost || now - l->status_ms > l->opts.down_ms)) {
            LOG_WARN("verifyd does not answer (%s): ending its generations", err_msg());
            link_fail_all(l, TD_ECLOSED, "verifyd stopped answering during the generation");
            /* Not fresh any more: /health and new requests see it down at once. */
            l->status_ms = now - l->opts.down_ms - 1;
            up = false;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        int64_t ns = until.tv_nsec + (int64_t)l->opts.poll_ms * 1000000;
        until.tv_sec += ns / 1000000000;
        until.tv_nsec = ns % 1000000000;
        while (!l->stopping && !l->pipe_lost &&
               pthread_cond_timedwait(&l->wake, &l->mu, &until) != ETIMEDOUT)
            ;
        bool stop = l->stopping;
        pthread_mutex_unlock(&l->mu);
        if (stop)
            break;
    }
    return NULL;
}

/* --- life cycle -------------------------------------------------------------------------------- */

td_err link_init(gw_link **out, const link_opts *o)
{
    *out = NULL;
    gw_link *l = calloc(1, sizeof *l);
    if (!l)
        return err_set(TD_ENOMEM, "link: out of memory");
    l->opts = *o;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->wake, NULL);
    l->next_seq = (uint64_t)getpid() << 32 | 1;
    l->next_request = (uint64_t)getpid() << 32 | 1;

    bus_opts bo;
    bus_opts_default(&bo);
    bo.send_timeout_ms = o->call_ms;
    bo.recv_timeout_ms = o->call_ms;
    td_err e = bus_client_init(&l->client, o->verifyd_url, &bo);
    int rv = 0;
    nng_listener lst;
    if (e == TD_OK && (rv = nng_pull0_open(&l->pull)) != 0)
        e = err_set(TD_EIO, "%s: opening the event socket: %s", o->events_url, nng_strerror(rv));
    if (e == TD_OK) {
        l->pull_open = true;
        if ((rv = nng_socket_set_size(l->pull, NNG_OPT_RECVMAXSZ, BUS_RECV_MAX_DEFAULT)) != 0 ||
            (rv = nng_socket_set_ms(l->pull, NNG_OPT_RECVTIMEO, LINK_RECV_POLL_MS)) != 0 ||
            (rv = nng_pipe_notify(l->pull, NNG_PIPE_EV_REM_POST, link_pipe_removed, l)) != 0 ||
            (rv = nng_listener_create(&lst, l->pull, o->events_url)) != 0 ||
            (rv = nng_listener_set_int(lst, NNG_OPT_IPC_PERMISSIONS, 0600)) != 0 ||
            (rv = nng_listener_start(lst, 0)) != 0)
            e = err_set(TD_EIO, "cannot listen on %s: %s", o->events_url, nng_strerror(rv));
    }
    if (e == TD_OK) {
        if (pthread_create(&l->rx, NULL, link_rx_main, l) == 0)
            l->rx_running = true;
        else
            e = err_set(TD_EIO, "link: cannot start the event thread");
    }
    if (e == TD_OK) {
        if (pthread_create(&l->poller, NULL, link_poller_main, l) == 0)
            l->poller_running = true;
        else
            e = err_set(TD_EIO, "link: cannot start the status thread");
    }
    if (e != TD_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", err_msg());
        link_free(l);
        return err_set(e, "%s", msg);
    }
    *out = l;
    return TD_OK;
}

void link_free(gw_link *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->stopping = true;
    pthread_cond_broadcast(&l->wake);
    pthread_mutex_unlock(&l->mu);
    if (l->poller_running)
        pthread_join(l->poller, NULL);
    if (l->rx_running)
        pthread_join(l->rx, NULL);
    if (l->pull_open)
        nng_close(l->pull);
    if (l->client)
        bus_client_free(l->client);
    while (l->gens) {
        link_gen *g = l->gens;
        l->gens = g->next;
        while (g->n) {
            link_event_free(&g->queue[g->head]);
            g->head = (g->head + 1) % g->cap;
            g->n--;
        }
        free(g->queue);
        pthread_cond_destroy(&g->cv);
        free(g);
    }
    pthread_cond_destroy(&l->wake);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

bool link_status(gw_link *l, msg_status *out)
{
    pthread_mutex_lock(&l->mu);
    *out = l->status;
    bool fresh = l->status_ms && link_now_ms() - l->status_ms <= l->opts.down_ms;
    pthread_mutex_unlock(&l->mu);
    return fresh;
}

/* --- generations ------------------------------------------------------------------------------ */

td_err link_gen_open(gw_link *l, link_gen **out)
{
    link_gen *g = calloc(1, sizeof *g);
    if (!g)
        return err_set(TD_ENOMEM, "link: out of memory");
    pthread_cond_init(&g->cv, NULL);
    g->link = l;
    pthread_mutex_lock(&l->mu);
    g->seq = l->next_seq++;
    g->next = l->gens;
    l->gens = g;
    pthread_mutex_unlock(&l->mu);
    *out = g;
    return TD_OK;
}

uint64_t link_gen_seq(const link_gen *g)
{
    return g->seq;
}

td_err link_gen_start(gw_link *l, link_gen *g, msg_gen_start *m)
{
    m->seq_id = g->seq;
    msg_buf req, reply;
    msg_buf_init(&req);
    msg_buf_init(&reply);
    msg_type type = MSG_ERROR;
    td_err e = msg_pack_gen_start(&req, link_request_id(l), m);
    if (e == TD_OK)
        e = link_call(l, &req, &reply, &type);
    if (e == TD_OK && type != MSG_ACK)
        e = err_set(TD_EPROTO, "verifyd answered gen_start with %s", msg_type_name(type));
    msg_buf_free(&req);
    msg_buf_free(&reply);
    if (e == TD_OK) {
        pthread_mutex_lock(&l->mu);
        g->started = true;
        pthread_mutex_unlock(&l->mu);
    }
    return e;
}

td_err link_gen_next(link_gen *g, int32_t timeout_ms, link_event *ev)
{
    pthread_mutex_t *mu = &g->link->mu;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    int64_t ns = until.tv_nsec + (int64_t)timeout_ms * 1000000;
    until.tv_sec += ns / 1000000000;
    until.tv_nsec = ns % 1000000000;
    pthread_mutex_lock(mu);
    while (g->n == 0)
        if (pthread_cond_timedwait(&g->cv, mu, &until) == ETIMEDOUT)
            break;
    td_err e = TD_ETIMEOUT;
    if (g->n > 0) {
        *ev = g->queue[g->head];
        g->head = (g->head + 1) % g->cap;
        g->n--;
        e = TD_OK;
    }
    pthread_mutex_unlock(mu);
    return e;
}

void link_gen_close(gw_link *l, link_gen *g, bool cancel)
{
    if (!g)
        return;
    pthread_mutex_lock(&l->mu);
    for (link_gen **p = &l->gens; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    bool send_cancel = cancel && !g->ended;
    while (g->n) {
        link_event_free(&g->queue[g->head]);
        g->head = (g->head + 1) % g->cap;
        g->n--;
    }
    pthread_mutex_unlock(&l->mu);
    if (send_cancel) {
        msg_buf req, reply;
        msg_buf_init(&req);
        msg_buf_init(&reply);
        msg_gen_cancel c = {.seq_id = g->seq};
        msg_type type;
        if (msg_pack_gen_cancel(&req, link_request_id(l), &c) != TD_OK ||
            link_call(l, &req, &reply, &type) != TD_OK)
            LOG_WARN("cancelling sequence %llu: %s", (unsigned long long)g->seq, err_msg());
        msg_buf_free(&req);
        msg_buf_free(&reply);
    }
    free(g->queue);
    pthread_cond_destroy(&g->cv);
    free(g);
}
