/* The PUSH side of verifyd's event stream (see events.h). */
#include "verifyd/events.h"

#include <nng/nng.h>
#include <nng/protocol/pipeline0/push.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

struct events {
    nng_socket sock;
    msg_buf buf;      /* reused for every event (only the scheduler thread sends) */
    int timeout_ms;   /* how long a send may wait for a gateway */
    uint64_t dropped; /* events no gateway took */
};

td_err events_open(events **out, const char *url, int send_timeout_ms)
{
    *out = NULL;
    events *ev = calloc(1, sizeof *ev);
    if (!ev)
        return err_set(TD_ENOMEM, "out of memory");
    msg_buf_init(&ev->buf);
    int rv;
    if ((rv = nng_push0_open(&ev->sock)) != 0) {
        free(ev);
        return err_set(TD_EIO, "%s: opening a push socket: %s", url, nng_strerror(rv));
    }
    /* A gateway that restarts is found again within 100 ms. */
    ev->timeout_ms = send_timeout_ms;
    if ((rv = nng_socket_set_ms(ev->sock, NNG_OPT_RECONNMINT, 10)) != 0 ||
        (rv = nng_socket_set_ms(ev->sock, NNG_OPT_RECONNMAXT, 100)) != 0 ||
        (rv = nng_socket_set_int(ev->sock, NNG_OPT_SENDBUF, 1024)) != 0 ||
        (rv = nng_dial(ev->sock, url, NULL, NNG_FLAG_NONBLOCK)) != 0) {
        nng_close(ev->sock);
        free(ev);
        return err_set(TD_EIO, "%s: cannot dial the event socket: %s", url, nng_strerror(rv));
    }
    *out = ev;
    return TD_OK;
}

void events_close(events *ev)
{
    if (!ev)
        return;
    nng_close(ev->sock);
    msg_buf_free(&ev->buf);
    free(ev);
}

td_err events_send(events *ev, const msg_gen_event *m)
{
    TD_TRY(msg_pack_gen_event(&ev->buf, m->seq_id, m));
    /* Non-blocking attempts on our own clock rather than a blocking send: NNG 1.5's timer
     * can miss an expiry, and the scheduler must never wait forever on a gateway. */
    int rv;
    for (int waited = 0;; waited++) {
        rv = nng_send(ev->sock, ev->buf.data, ev->buf.len, NNG_FLAG_NONBLOCK);
        if (rv != NNG_EAGAIN || waited >= ev->timeout_ms)
            break;
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    if (rv != 0) {
        if (ev->dropped++ % 100 == 0)
            LOG_WARN("event of sequence %llu dropped (%llu so far): %s",
                     (unsigned long long)m->seq_id, (unsigned long long)ev->dropped,
                     nng_strerror(rv));
        return err_set(rv == NNG_EAGAIN ? TD_ETIMEOUT : TD_EIO, "event not sent: %s",
                       nng_strerror(rv));
    }
    return TD_OK;
}

uint64_t events_dropped(const events *ev)
{
    return ev->dropped;
}
