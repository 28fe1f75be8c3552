/* verifyd's link to draftd: propose calls with a deadline, and the state "attached or not".
 *
 * A proposal that fails, errors or comes too late marks the link down: the scheduler then
 * decodes plainly (output unchanged) and a probe thread says hello to draftd every
 * DLINK_PROBE_MS until it answers, which marks the link up again. So an absent draftd costs
 * the scheduler nothing but the plain steps. */
#ifndef TANDEM_VERIFYD_DLINK_H
#define TANDEM_VERIFYD_DLINK_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/msg.h"

#define DLINK_PROBE_MS 100 /* how often a down link says hello to draftd */
/* How long a propose call polls for its reply before it sleeps, where the target runs on a
 * GPU: a 27B draft step is ~2.5 ms, and a reply that wakes a sleeping thread lands tens of
 * us later (bench_bus: a round trip of ~190 us sleeping, ~130 polling, on one machine). The
 * scheduler has nothing else to do meanwhile; a CPU target leaves the cores to draftd. */
#define DLINK_SPIN_US 5000

typedef struct dlink dlink;

/* spin_us: bus_opts.spin_us of the link's calls (DLINK_SPIN_US or 0). */
td_err dlink_open(dlink **out, const char *url, int32_t spin_us);
void dlink_close(dlink *d);

/* True while draftd answers. */
bool dlink_up(dlink *d);

/* One proposal within timeout_ms; out is freed by msg_free_proposal. Any failure (an error
 * reply, a timeout, a closed connection, a reply for another request) marks the link down
 * and returns the error. */
td_err dlink_propose(dlink *d, const msg_propose *req, msg_proposal *out, int timeout_ms);

/* Times the link came up (the first attach included), and proposals that failed. */
uint64_t dlink_attaches(dlink *d);
uint64_t dlink_failures(dlink *d);

#endif
