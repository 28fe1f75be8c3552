/* The gateway's link to verifyd (pipeline.md): control calls over verifyd's request socket
 * (gen_start, gen_cancel, status_get, hello) and the stream of gen_event messages verifyd
 * pushes to the gateway's own PULL socket (gateway-events.ipc).
 *
 * Each generation registers a link_gen before it starts, so no event can arrive for an unknown
 * sequence; a receiver thread files each event under its seq_id and wakes the waiter. A poller
 * thread asks verifyd for its status every poll_ms: /health and /metrics read the last answer,
 * and when verifyd stops answering (for down_ms, or for a short while right after its event
 * connection closed, which is how a verifyd that dies shows first), or answers from a new
 * process (its hello pid changed), every open generation gets an ERROR event at once, so no
 * request waits for events that will never come. Every wait has a timeout. */
#ifndef TANDEM_GATEWAY_LINK_H
#define TANDEM_GATEWAY_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/msg.h"

typedef struct link_opts {
    const char *verifyd_url; /* verifyd's request socket, "ipc://.../verifyd.ipc" */
    const char *events_url;  /* the gateway's event socket to listen on */
    int32_t call_ms;         /* ms one control call may take */
    int32_t poll_ms;         /* ms between status polls */
    int32_t down_ms;         /* ms without an answer after which verifyd counts as down */
} link_opts;

/* One event, copied out of the message. */
typedef struct link_event {
    msg_event_kind kind;
    uint32_t *tokens;       /* [n_tokens] committed token ids */
    uint32_t n_tokens;
    msg_logprob *logprobs;  /* [n_logprobs] (0 or n_tokens) */
    uint32_t n_logprobs;
    msg_finish finish;
    msg_usage usage;        /* running totals */
    td_err code;            /* ERROR: why */
    char message[MSG_ERROR_MAX + 1];
} link_event;

void link_event_free(link_event *e);

typedef struct gw_link gw_link;
typedef struct link_gen link_gen;

td_err link_init(gw_link **out, const link_opts *o);
void link_free(gw_link *l);

/* The last status verifyd gave. False when verifyd has not answered within down_ms (*out then
 * holds the last answer, or zeros). */
bool link_status(gw_link *l, msg_status *out);

/* A new generation with a fresh seq_id, registered for events. */
td_err link_gen_open(gw_link *l, link_gen **out);
uint64_t link_gen_seq(const link_gen *g);

/* Sends gen_start (m->seq_id is set here). TD_OK when verifyd acknowledged; otherwise verifyd's
 * error code and message (TD_EBUSY at capacity, TD_ERANGE context overflow, ...), or
 * TD_ETIMEOUT / TD_ECLOSED when it did not answer. */
td_err link_gen_start(gw_link *l, link_gen *g, msg_gen_start *m);

/* Waits up to timeout_ms for the generation's next event. TD_ETIMEOUT when none came. */
td_err link_gen_next(link_gen *g, int32_t timeout_ms, link_event *ev);

/* Unregisters and frees g; with cancel, and unless its last event came, first tells verifyd to
 * stop it (best effort: a verifyd that is gone frees its sequences itself). Cancel a start
 * that timed out too: verifyd may have started it without its answer arriving. */
void link_gen_close(gw_link *l, link_gen *g, bool cancel);

#endif
