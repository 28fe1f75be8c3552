/* The link to draftd (see dlink.h). */
#include "verifyd/dlink.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common/bus.h"
#include "common/kvclient.h"
#include "common/log.h"

struct dlink {
    bus_client *bus;
    pthread_t probe;
    int stop;          /* atomic: dlink_close has begun */
    int up;            /* atomic: draftd answered the last call */
    uint64_t attaches; /* atomic */
    uint64_t failures; /* atomic */
    uint64_t next_id;  /* request ids (only the scheduler thread proposes) */
    msg_buf buf;       /* the scheduler's request/reply buffer */
};

static void dlink_set_up(dlink *d, bool up)
{
    int was = __atomic_exchange_n(&d->up, up ? 1 : 0, __ATOMIC_ACQ_REL);
    if (up && !was) {
        __atomic_add_fetch(&d->attaches, 1, __ATOMIC_RELAXED);
        LOG_INFO("draftd attached: speculative decoding on");
    } else if (!up && was) {
        LOG_WARN("draftd detached (%s): plain decoding until it answers again", err_msg());
    }
}

/* Says hello every DLINK_PROBE_MS while the link is down. */
static void *dlink_probe_main(void *arg)
{
    dlink *d = arg;
    msg_buf b;
    msg_buf_init(&b);
    uint64_t id = 1ull << 63;
    while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, DLINK_PROBE_MS * 1000000L};
        nanosleep(&ts, NULL);
        if (__atomic_load_n(&d->up, __ATOMIC_ACQUIRE))
            continue;
        msg_hello me = {.role = MSG_ROLE_VERIFYD, .pid = (uint32_t)getpid(),
                        .protocol = MSG_PROTOCOL_VERSION};
        msg_hello peer;
        if (msg_pack_hello(&b, id++, &me) == TD_OK &&
            bus_client_call(d->bus, b.data, b.len, &b, 500) == TD_OK &&
            msg_unpack_hello(b.data, b.len, NULL, &peer) == TD_OK && peer.role == MSG_ROLE_DRAFTD)
            dlink_set_up(d, true);
    }
    msg_buf_free(&b);
    return NULL;
}

td_err dlink_open(dlink **out, const char *url, int32_t spin_us)
{
    *out = NULL;
    dlink *d = calloc(1, sizeof *d);
    if (!d)
        return err_set(TD_ENOMEM, "out of memory");
    msg_buf_init(&d->buf);
    d->next_id = 1;
    bus_opts o;
    bus_opts_default(&o);
    o.recv_max = (size_t)64 << 20; /* a sampling proposal over a full vocabulary is large */
    o.spin_us = spin_us;
    td_err e = bus_client_init(&d->bus, url, &o);
    if (e == TD_OK && pthread_create(&d->probe, NULL, dlink_probe_main, d) != 0)
        e = err_set(TD_EIO, "cannot start the draftd probe thread");
    if (e != TD_OK) {
        bus_client_free(d->bus);
        free(d);
        return e;
    }
    *out = d;
    return TD_OK;
}

void dlink_close(dlink *d)
{
    if (!d)
        return;
    __atomic_store_n(&d->stop, 1, __ATOMIC_RELEASE);
    pthread_join(d->probe, NULL);
    bus_client_free(d->bus);
    msg_buf_free(&d->buf);
    free(d);
}

bool dlink_up(dlink *d)
{
    return __atomic_load_n(&d->up, __ATOMIC_ACQUIRE) != 0;
}

td_err dlink_propose(dlink *d, const msg_propose *req, msg_proposal *out, int timeout_ms)
{
    uint64_t id = d->next_id++;
    td_err e = msg_pack_propose(&d->buf, id, req);
    if (e == TD_OK)
        e = bus_client_call(d->bus, d->buf.data, d->buf.len, &d->buf, timeout_ms);
    uint64_t rid = 0;
    if (e == TD_OK && msg_unpack_proposal(d->buf.data, d->buf.len, &rid, out) != TD_OK)
        e = kvc_reply_error(&d->buf, "propose");
    if (e == TD_OK && (rid != id || out->seq_id != req->seq_id || out->n_past != req->n_past)) {
        msg_free_proposal(out);
        e = err_set(TD_EPROTO, "draftd answered another proposal");
    }
    if (e != TD_OK) {
        __atomic_add_fetch(&d->failures, 1, __ATOMIC_RELAXED);
        dlink_set_up(d, false);
    }
    return e;
}

uint64_t dlink_attaches(dlink *d)
{
    return __atomic_load_n(&d->attaches, __ATOMIC_RELAXED);
}

uint64_t dlink_failures(dlink *d)
{
    return __atomic_load_n(&d->failures, __ATOMIC_RELAXED);
}
