/* Prometheus metrics of the gateway (GET /metrics, text format 0.0.4).
 *
 * The gateway counts what it sees itself: HTTP requests by endpoint and status, prompt and
 * generated tokens, generated tokens per second over the last 10 seconds, requests waiting for
 * a free sequence slot. The backend's numbers (acceptance length histogram, draft, verify and
 * prefill time, draftd attaches and failures, active and queued sequences) come from verifyd's
 * last status answer and are rendered next to them. Counters are updated with atomics, from
 * any connection thread. */
#ifndef TANDEM_GATEWAY_METRICS_H
#define TANDEM_GATEWAY_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/msg.h"

typedef enum metrics_endpoint {
    MET_EP_CHAT = 0,
    MET_EP_COMPLETIONS,
    MET_EP_RESPONSES,
    MET_EP_MODELS,
    MET_EP_HEALTH,
    MET_EP_METRICS,
    MET_EP_TOKENIZE,
    MET_EP_DETOKENIZE,
    MET_EP_OTHER,
    MET_EP_COUNT
} metrics_endpoint;

#define MET_STATUS_MAX 600 /* HTTP status codes counted: 0..599 */
#define MET_RATE_WINDOW 10 /* seconds of the tokens-per-second window */

typedef struct gw_metrics {
    uint64_t requests[MET_EP_COUNT][MET_STATUS_MAX]; /* by endpoint and status code */
    uint64_t prompt_tokens;     /* tokens of prompts sent to verifyd */
    uint64_t cached_tokens;     /* prompt tokens verifyd reused from its prefix cache */
    uint64_t generated_tokens;  /* tokens returned to clients */
    uint64_t prediction_accepted; /* prediction tokens verifyd took as accepted drafts */
    uint64_t prediction_rejected; /* and those it did not */
    uint64_t tool_calls;        /* tool calls returned to clients */
    uint64_t generations;       /* generations finished (any finish reason) */
    uint64_t generation_errors; /* generations that ended with an error */
    uint64_t cancelled;         /* generations cancelled because the client went away */
    int64_t waiting;            /* requests waiting for verifyd to accept them (busy) */
    int64_t in_flight;          /* generations running */
    uint64_t responses_kept;    /* /v1/responses kept (set when rendering) */
    uint64_t responses_bytes;   /* bytes of their JSON text */
    uint64_t background_running; /* background responses running (set when rendering) */
    uint64_t rate_sec[MET_RATE_WINDOW];    /* Unix second each bucket counts */
    uint64_t rate_tokens[MET_RATE_WINDOW]; /* tokens generated in that second */
} gw_metrics;

void metrics_init(gw_metrics *m);

/* Counts a finished HTTP request. */
void metrics_request(gw_metrics *m, metrics_endpoint ep, int status);

/* Counts generated tokens (and feeds the tokens-per-second window). */
void metrics_tokens(gw_metrics *m, uint64_t n);

/* Adds delta to a gauge or counter field with an atomic add. */
void metrics_add(int64_t *field, int64_t delta);
void metrics_addu(uint64_t *field, uint64_t delta);

/* The exposition text, malloc'd. st is verifyd's last status, or NULL when it is not
 * answering (the backend series then read 0 and tandem_verifyd_up reads 0). */
char *metrics_render(gw_metrics *m, const msg_status *st);

#endif
