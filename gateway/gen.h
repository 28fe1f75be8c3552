/* One generation from a parsed request to its reply: prompt building (chat template or
 * completion prompt), the context check, gen_start with waiting while verifyd is busy, and the
 * events turned into SSE chunks or a whole body through the output pipeline. Used by api.c. */
#ifndef TANDEM_GATEWAY_GEN_H
#define TANDEM_GATEWAY_GEN_H

#include "gateway/api.h"
#include "gateway/request.h"

/* Runs the request of kind (parsed from c's body) and fills r: a stream, or the whole body
 * once the generation ended, or an error. */
void gen_handle(gw_state *g, const api_call *c, req_kind kind, api_reply *r);

/* The chat request's prompt: its messages through the model's template (tools, kwargs),
 * tokenized; *in_think when it leaves a reasoning block open. */
td_err gen_chat_prompt(gw_state *g, const gw_request *req, tok_ids *ids, bool *in_think,
                       api_error *e);

/* The context every request must fit: --ctx, else verifyd's, else the model's (0: unknown). */
uint32_t gen_ctx(gw_state *g);

/* Fills r with the error body of e. */
void gen_reply_error(api_reply *r, const api_error *e);

#endif
