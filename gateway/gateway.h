/* The gateway's shared state: its settings, the model's tokenizer and chat template (the
 * gateway never loads weights), the link to verifyd and the metrics. Built once in main and
 * read by every connection thread; after gw_init only the metrics and `stopping` change. */
#ifndef TANDEM_GATEWAY_GATEWAY_H
#define TANDEM_GATEWAY_GATEWAY_H

#include <stdbool.h>
#include <stdint.h>

#include "common/chat.h"
#include "common/err.h"
#include "common/tokenizer.h"
#include "gateway/link.h"
#include "gateway/metrics.h"

typedef struct gw_config {
    const char *model_path;   /* GGUF file: tokenizer, chat template, name */
    const char *model_name;   /* name clients use, or NULL: general.name, else the file name */
    const char *api_key;      /* Bearer key required on /v1, /tokenize, /detokenize; NULL: none */
    int64_t max_body;         /* bytes of a request body; more is 413 */
    int64_t max_tokens_limit; /* tokens one request may ask for; 0 = only the context bounds it */
    int64_t ctx;              /* context positions checked here; 0 = verifyd's, else the model's */
    int64_t timeout_s;        /* seconds a request may wait for verifyd (busy, or silent) */
    int64_t responses_kept;   /* /v1/responses kept for previous_response_id; 0: none */
    int64_t responses_mib;    /* MiB of their JSON text at most (>= 1 when any are kept) */
    int64_t responses_background; /* background responses running at once; 0: none */
} gw_config;

typedef struct gw_state {
    gw_config cfg;
    tokenizer *tok;
    chat_model chat;          /* template text and BOS/EOS texts */
    chat_template *tmpl;      /* parsed once; NULL when the model has no template */
    char model_name[256];
    uint32_t model_ctx;       /* the model's training context (<arch>.context_length), 0 unknown */
    int32_t stop_ids[2];      /* end-of-generation tokens (eos, eot), -1 when absent */
    gw_link *link;            /* NULL in tests that only parse and render */
    struct rstore *responses; /* the kept responses, or NULL (responses_kept 0) */
    struct bg_table *background; /* background responses, or NULL (none kept, or
                                  * responses_background 0) */
    gw_metrics metrics;
    int64_t started;          /* Unix time the gateway started (model "created") */
    bool stopping;            /* set (atomically) at shutdown: running generations end */
} gw_state;

/* Loads the model file's tokenizer, template and name. The link is set by the caller. */
td_err gw_init(gw_state *g, const gw_config *cfg);
/* Waits for the background responses to end (after `stopping` was set and the HTTP server
 * stopped; before the link goes). */
void gw_drain(gw_state *g);
void gw_free(gw_state *g);

#endif
