/* verifyd's token events to the gateway: a PUSH socket dialing the gateway's PULL endpoint
 * (gateway-events.ipc), one gen_event message per send. The dial runs in the background and
 * reconnects; a send waits at most the send timeout for a gateway, then the event is dropped
 * (logged): nobody is reading it, and the scheduler must not stall on an absent gateway. */
#ifndef TANDEM_VERIFYD_EVENTS_H
#define TANDEM_VERIFYD_EVENTS_H

#include "common/err.h"
#include "common/msg.h"

typedef struct events events;

td_err events_open(events **out, const char *url, int send_timeout_ms);
void events_close(events *ev);

/* Packs and sends one event. TD_ETIMEOUT when no gateway took it in time. */
td_err events_send(events *ev, const msg_gen_event *m);

/* Events dropped so far. */
uint64_t events_dropped(const events *ev);

#endif
