/* Responses kept by the gateway (/v1/responses with `store`), for `previous_response_id` and
 * GET / DELETE /v1/responses/<id> and GET /v1/responses/<id>/input_items: each response
 * object, the conversation that led to it and its request's input items, as JSON text. The
 * least recently used go first when there are more than max_items or their text passes
 * max_bytes. In memory only: a gateway restart forgets them. Safe to use from every
 * connection thread. */
#ifndef TANDEM_GATEWAY_RESPSTORE_H
#define TANDEM_GATEWAY_RESPSTORE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/err.h"

typedef struct rstore rstore;

/* max_items >= 1; max_bytes: of the kept JSON text, >= 1. */
td_err rstore_init(rstore **out, size_t max_items, size_t max_bytes);
void rstore_free(rstore *s);

/* What is kept of a response. */
typedef enum rstore_part {
    RSTORE_RESPONSE, /* the response object */
    RSTORE_CONV,     /* the conversation: chat messages, its own output included */
    RSTORE_INPUT,    /* the request's input items, as GET .../input_items lists them */
    RSTORE_PARTS
} rstore_part;

/* Keeps the three parts under id (replacing what was kept under it). False when they were not
 * kept: out of memory, or they alone are larger than max_bytes. */
bool rstore_put(rstore *s, const char *id, const json_t *response, const json_t *conv,
                const json_t *input);

/* A fresh copy of one part of what is kept under id; false (*out NULL) when nothing is. */
bool rstore_get(rstore *s, const char *id, rstore_part part, json_t **out);

/* Forgets id; false when nothing was kept under it. */
bool rstore_delete(rstore *s, const char *id);

/* Responses kept and the bytes of their text. */
void rstore_usage(rstore *s, size_t *items, size_t *bytes);

#endif
