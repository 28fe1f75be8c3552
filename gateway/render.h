/* Response bodies and server-sent events of the OpenAI API (DESIGN section 10).
 *
 * A streamed chat response is one SSE event per chunk, "data: {json}\n\n", all with the same
 * id and created time: the first chunk's delta carries the role, finish_reason is null until
 * the last choice chunk ("stop", "length" or "tool_calls"), stream_options.include_usage adds
 * a chunk with empty choices and the usage (and "usage":null on the others, as OpenAI does),
 * and "data: [DONE]\n\n" ends the stream. An error in the middle of a stream is an event
 * holding the error object, followed by [DONE].
 *
 * Every function returns a malloc'd NUL-terminated string, or NULL when out of memory. JSON is
 * compact and keys keep the order written here. */
#ifndef TANDEM_GATEWAY_RENDER_H
#define TANDEM_GATEWAY_RENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "gateway/apierr.h"
#include "gateway/output.h"

#define RENDER_SSE_DONE "data: [DONE]\n\n"

/* A response's token counts. */
typedef struct gw_usage {
    uint32_t prompt_tokens;     /* tokens of the prompt */
    uint32_t completion_tokens; /* tokens generated (up to a stop string's end) */
    uint32_t cached_tokens;     /* prompt tokens reused from the prefix cache */
    uint32_t steps;             /* verify passes while decoding: acceptance = tokens / steps */
    bool predicted;             /* the request had a prediction */
    uint32_t accepted_prediction; /* its tokens taken into the completion as accepted drafts */
    uint32_t rejected_prediction; /* and those that were not */
} gw_usage;

/* What every chunk or response of one request shares. */
typedef struct render_ctx {
    const char *id;       /* "chatcmpl-..." or "cmpl-..." */
    int64_t created;      /* Unix time, seconds */
    const char *model;    /* the model name the client sees */
    bool usage_null;      /* streamed with include_usage: "usage":null on choice chunks */
    const gw_usage *live_usage; /* continuous_usage_stats: this usage on every choice chunk
                                 * (instead of null), or NULL */
    const char *call_ids; /* tool-call ids are "call_<call_ids>_<index>" */
    uint32_t index;       /* the choice that chunks and choice objects are of */
} render_ctx;

/* {"prompt_tokens":..,"completion_tokens":..,"total_tokens":..,
 *  "prompt_tokens_details":{"cached_tokens":..},"acceptance_length":..} where the acceptance
 * length (tokens committed per target pass) is omitted while no step was made; with a
 * prediction also "completion_tokens_details":{"accepted_prediction_tokens":..,
 * "rejected_prediction_tokens":..}. */
json_t *render_usage(const gw_usage *u);

/* usage's "acceptance_length" (tokens committed per target pass, to 1/1000), unless no step
 * was made. */
void render_acceptance(json_t *usage, const gw_usage *u);

/* "event: type\ndata: {data}\n\n" (the Responses API's events); releases data. */
char *render_event(const char *type, json_t *data);

/* The delta of one piece: {"content":..}, {"reasoning_content":..} or
 * {"tool_calls":[{"index":i,"id":..,"type":"function","function":{"name":..,"arguments":..}}]}
 * for a whole call (a begun one: arguments ""); more of a begun call (OUT_CALL_ARGS, and its
 * OUT_TOOL_CALL: the arguments after the streamed ones) is
 * {"tool_calls":[{"index":i,"function":{"arguments":..}}]}. */
json_t *render_delta(const render_ctx *c, const out_piece *p);

/* "data: {chat.completion.chunk}\n\n" with one choice (c->index): delta (reference taken;
 * NULL = {}), finish (NULL = null) and logprobs (reference taken; NULL = null). */
char *render_chat_chunk(const render_ctx *c, json_t *delta, const char *finish, json_t *logprobs);

/* The final usage chunk: empty choices, the usage. */
char *render_chat_usage_chunk(const render_ctx *c, const gw_usage *u);

/* One choice (c->index) of a whole chat.completion. content NULL gives "content":null;
 * reasoning NULL leaves out "reasoning_content"; tool_calls (reference taken) NULL or empty
 * leaves out "tool_calls"; logprobs (reference taken) NULL gives null. */
json_t *render_chat_choice(const render_ctx *c, const char *content, size_t content_len,
                           const char *reasoning, size_t reasoning_len, json_t *tool_calls,
                           const char *finish, json_t *logprobs);

/* A whole chat.completion of choices (an array of render_chat_choice's) and, when not NULL,
 * vLLM's prompt_logprobs beside them (references taken). */
char *render_chat_response(const render_ctx *c, json_t *choices, const gw_usage *u,
                           json_t *prompt_logprobs);

/* A tool call as an element of a message's "tool_calls" (no "index"). */
json_t *render_tool_call(const render_ctx *c, const out_piece *p);

/* "data: {text_completion chunk}\n\n". */
char *render_completion_chunk(const render_ctx *c, const char *text, size_t len,
                              const char *finish, json_t *logprobs);
char *render_completion_usage_chunk(const render_ctx *c, const gw_usage *u);
/* One choice (c->index) of a whole text_completion; logprobs (reference taken) NULL gives
 * null. */
json_t *render_completion_choice(const render_ctx *c, const char *text, size_t len,
                                 const char *finish, json_t *logprobs);
/* A whole text_completion of choices (render_completion_choice's; reference taken). */
char *render_completion_response(const render_ctx *c, json_t *choices, const gw_usage *u);

/* {"object":"list","data":[{"id":model,"object":"model","created":..,"owned_by":"tandem"}]} */
char *render_models(const char *model, int64_t created, int64_t max_model_len);

/* "data: {"error":{...}}\n\n" */
char *render_sse_error(const api_error *e);

/* json_dumps with the flags every body uses (compact, reals with 15 significant digits). */
char *render_dump(const json_t *v);

#endif
