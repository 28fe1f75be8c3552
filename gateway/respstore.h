/* Responses kept by the gateway (/v1/responses with `store`), for `previous_response_id` and
 * GET / DELETE /v1/responses/<id>: each response object and the conversation that led to it
 * (chat messages, its own output included), as JSON text. The least recently used go first
 * when there are more than max_items or their text passes max_bytes. In memory only: a
 * gateway restart forgets them. Safe to use from every connection thread. */
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

/* Keeps the response and its conversation under id (replacing one kept under it). False when
 * they were not kept: out of memory, or one alone is larger than max_bytes. */
bool rstore_put(rstore *s, const char *id, const json_t *response, const json_t *conv);

/* Fresh copies of what is kept under id (either out may be NULL); false when nothing is. */
bool rstore_get(rstore *s, const char *id, json_t **response, json_t **conv);

/* Forgets id; false when nothing was kept under it. */
bool rstore_delete(rstore *s, const char *id);

/* Responses kept and the bytes of their text. */
void rstore_usage(rstore *s, size_t *items, size_t *bytes);

#endif
