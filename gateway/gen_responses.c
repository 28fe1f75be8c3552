/* /v1/responses (gen_int.h): the chat generation's pieces as OpenAI Responses output items,
 * whole or as the Responses API's stream of typed events.
 *
 * Items come in the order the model wrote them: a reasoning item (its text as reasoning_text
 * content), a message (one output_text part), a function_call per tool call. A streamed item
 * is opened (response.output_item.added, response.content_part.added), grows by deltas
 * (response.reasoning_text.delta, response.output_text.delta) and is closed (the .done events
 * with its whole text, then response.output_item.done) when an item of another kind starts or
 * the generation ends; a function call is added once its name is known (OUT_CALL_OPEN, or
 * whole), grows by response.function_call_arguments.delta and is done when its block ends.
 * Every event has a sequence_number
 * from 0, and the stream ends with response.completed (response.incomplete when
 * max_output_tokens cut it) holding the whole response. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "gateway/gen_int.h"
#include "gateway/respstore.h"

/* The stream's next event of type: data gets "type" and "sequence_number" first. */
static void resp_event(api_stream *s, const char *type, json_t *data)
{
    if (!s->stream) {
        json_decref(data);
        return;
    }
    json_t *o = json_pack("{s:s,s:I}", "type", type, "sequence_number",
                          (json_int_t)s->rs.seq++);
    if (!o || !data || json_object_update(o, data) != 0) {
        json_decref(o);
        json_decref(data);
        gen_oom(s);
        return;
    }
    json_decref(data);
    gen_sse_put(s, render_event(type, o));
}

/* A field of the client's body, or dflt (reference taken) when absent or null. */
static json_t *resp_given(const api_stream *s, const char *key, json_t *dflt)
{
    const json_t *v = json_object_get(s->req.resp, key);
    if (v && !json_is_null(v)) {
        json_decref(dflt);
        return json_deep_copy(v);
    }
    return dflt;
}

static json_t *resp_usage(const api_stream *s)
{
    const gw_usage *u = &s->total;
    json_t *o = json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens",
                          (json_int_t)u->prompt_tokens, "input_tokens_details", "cached_tokens",
                          (json_int_t)u->cached_tokens, "output_tokens",
                          (json_int_t)u->completion_tokens, "output_tokens_details",
                          "reasoning_tokens", (json_int_t)s->out.reasoning_tokens,
                          "total_tokens",
                          (json_int_t)u->prompt_tokens + (json_int_t)u->completion_tokens);
    if (o)
        render_acceptance(o, u);
    return o;
}

/* The response object with status: "queued" or "in_progress" (no output, no usage yet),
 * "completed", "incomplete", "cancelled" (the output so far) or "failed" (s->err). */
static json_t *resp_object(api_stream *s, const char *status)
{
    const bool running = strcmp(status, "in_progress") == 0 || strcmp(status, "queued") == 0;
    const bool failed = strcmp(status, "failed") == 0;
    const bool cancelled = strcmp(status, "cancelled") == 0;
    const bool incomplete = strcmp(status, "incomplete") == 0;
    const json_t *reasoning = json_object_get(s->req.resp, "reasoning");
    const json_t *text = json_object_get(s->req.resp, "text");
    const json_t *effort = json_is_object(reasoning) ? json_object_get(reasoning, "effort") : NULL;
    const json_t *summary = json_is_object(reasoning) ? json_object_get(reasoning, "summary")
                                                       : NULL;
    const json_t *format = json_is_object(text) ? json_object_get(text, "format") : NULL;
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_object_set_new(o, "id", json_string(s->id));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "created_at", json_integer(s->rc.created));
    json_object_set_new(o, "status", json_string(status));
    json_object_set_new(o, "background", json_boolean(s->job != NULL));
    json_object_set_new(o, "completed_at", running || failed || cancelled
                                               ? json_null()
                                               : json_integer(time(NULL)));
    json_object_set_new(o, "error", failed ? json_pack("{s:s,s:s}", "code",
                                                       s->err.code ? s->err.code
                                                                   : "server_error",
                                                       "message", s->err.message)
                                           : json_null());
    json_object_set_new(o, "incomplete_details",
                        incomplete ? json_pack("{s:s}", "reason", "max_output_tokens")
                                   : json_null());
    json_object_set_new(o, "instructions", resp_given(s, "instructions", json_null()));
    json_object_set_new(o, "max_output_tokens", resp_given(s, "max_output_tokens", json_null()));
    json_object_set_new(o, "max_tool_calls", resp_given(s, "max_tool_calls", json_null()));
    json_object_set_new(o, "metadata", resp_given(s, "metadata", json_object()));
    json_object_set_new(o, "model", json_string(s->rc.model));
    json_object_set_new(o, "output", running ? json_array() : json_deep_copy(s->rs.items));
    json_object_set_new(o, "parallel_tool_calls", json_boolean(s->req.parallel_calls));
    json_object_set_new(o, "previous_response_id",
                        resp_given(s, "previous_response_id", json_null()));
    json_object_set_new(o, "reasoning",
                        json_pack("{s:O,s:O}", "effort", effort ? effort : json_null(),
                                  "summary", summary ? summary : json_null()));
    json_object_set_new(o, "store", json_boolean(s->req.resp_keep));
    json_object_set_new(o, "temperature", json_real(s->req.sampling.temperature));
    json_object_set_new(o, "text", json_pack("{s:o}", "format",
                                             format && !json_is_null(format)
                                                 ? json_deep_copy(format)
                                                 : json_pack("{s:s}", "type", "text")));
    json_object_set_new(o, "tool_choice", resp_given(s, "tool_choice", json_string("auto")));
    json_object_set_new(o, "tools", resp_given(s, "tools", json_array()));
    json_object_set_new(o, "top_logprobs", resp_given(s, "top_logprobs", json_integer(0)));
    json_object_set_new(o, "top_p", json_real(s->req.sampling.top_p));
    json_object_set_new(o, "truncation", resp_given(s, "truncation", json_string("disabled")));
    json_object_set_new(o, "usage", running || failed ? json_null() : resp_usage(s));
    json_object_set_new(o, "user", resp_given(s, "user", json_null()));
    return o;
}

/* The open item's part (its text so far) as the content_part events carry it. */
static json_t *resp_part(const api_stream *s, bool whole)
{
    const resp_state *rs = &s->rs;
    json_t *text = whole ? json_stringn(rs->text.p ? rs->text.p : "", rs->text.len)
                         : json_string("");
    if (rs->open == OUT_REASONING)
        return json_pack("{s:s,s:o}", "type", "reasoning_text", "text", text);
    json_t *part = json_pack("{s:s,s:[],s:o}", "type", "output_text", "annotations", "text",
                             text);
    if (part && whole && rs->lp)
        json_object_set(part, "logprobs", rs->lp);
    return part;
}

/* The item being written, whole, with status. */
static json_t *resp_open_item(api_stream *s, const char *status)
{
    const resp_state *rs = &s->rs;
    json_t *part = resp_part(s, true);
    if (rs->open == OUT_REASONING)
        return json_pack("{s:s,s:s,s:[],s:[o],s:s}", "id", rs->item_id, "type", "reasoning",
                         "summary", "content", part, "status", status);
    return json_pack("{s:s,s:s,s:s,s:s,s:[o]}", "id", rs->item_id, "type", "message", "status",
                     status, "role", "assistant", "content", part);
}

static json_int_t resp_index(const api_stream *s)
{
    return (json_int_t)json_array_size(s->rs.items);
}

/* Closes the open item (status "completed" or "incomplete") into the items. */
static void resp_close(api_stream *s, const char *status)
{
    resp_state *rs = &s->rs;
    if (!rs->open)
        return;
    const json_int_t at = resp_index(s);
    json_t *text = json_stringn(rs->text.p ? rs->text.p : "", rs->text.len);
    if (rs->open == OUT_REASONING) {
        resp_event(s, "response.reasoning_text.done",
                   json_pack("{s:s,s:I,s:i,s:O}", "item_id", rs->item_id, "output_index", at,
                             "content_index", 0, "text", text));
    } else {
        resp_event(s, "response.output_text.done",
                   json_pack("{s:s,s:I,s:i,s:O,s:o}", "item_id", rs->item_id, "output_index",
                             at, "content_index", 0, "text", text, "logprobs",
                             rs->lp ? json_incref(rs->lp) : json_array()));
    }
    json_decref(text);
    resp_event(s, "response.content_part.done",
               json_pack("{s:s,s:I,s:i,s:o}", "item_id", rs->item_id, "output_index", at,
                         "content_index", 0, "part", resp_part(s, true)));
    json_t *item = resp_open_item(s, status);
    resp_event(s, "response.output_item.done",
               json_pack("{s:I,s:O}", "output_index", at, "item", item));
    if (!item || json_array_append_new(rs->items, item) != 0)
        gen_oom(s);
    rs->open = 0;
    rs->text.len = 0;
    json_decref(rs->lp);
    rs->lp = NULL;
}

/* A new item id: prefix and 32 hex digits (cap >= strlen(prefix) + 33). */
static void resp_new_id(char *out, size_t cap, const char *prefix)
{
    const size_t n = strlen(prefix);
    TD_ASSERT(cap >= n + 33);
    memcpy(out, prefix, n);
    gen_hex(out + n, 16);
}

/* Opens an item of kind (OUT_REASONING or OUT_CONTENT). */
static void resp_open(api_stream *s, out_kind kind)
{
    resp_state *rs = &s->rs;
    rs->open = kind;
    resp_new_id(rs->item_id, sizeof rs->item_id, kind == OUT_REASONING ? "rs_" : "msg_");
    const json_int_t at = resp_index(s);
    resp_event(s, "response.output_item.added",
               json_pack("{s:I,s:o}", "output_index", at, "item", kind == OUT_REASONING
                         ? json_pack("{s:s,s:s,s:[],s:[],s:s}", "id", rs->item_id, "type",
                                     "reasoning", "summary", "content", "status", "in_progress")
                         : json_pack("{s:s,s:s,s:s,s:s,s:[]}", "id", rs->item_id, "type",
                                     "message", "status", "in_progress", "role", "assistant",
                                     "content")));
    resp_event(s, "response.content_part.added",
               json_pack("{s:s,s:I,s:i,s:o}", "item_id", rs->item_id, "output_index", at,
                         "content_index", 0, "part", resp_part(s, false)));
}

void resp_begin(api_stream *s)
{
    resp_event(s, "response.created", json_pack("{s:o}", "response",
                                                 resp_object(s, "in_progress")));
    resp_event(s, "response.in_progress", json_pack("{s:o}", "response",
                                                    resp_object(s, "in_progress")));
}

/* A function call begins (OUT_CALL_OPEN, or a whole OUT_TOOL_CALL): its item is added. */
static void resp_call_open(api_stream *s, const out_piece *p)
{
    resp_state *rs = &s->rs;
    resp_new_id(rs->call_item_id, sizeof rs->call_item_id, "fc_");
    snprintf(rs->call_id, sizeof rs->call_id, "call_%s_%u", s->call_ids, p->call_index);
    resp_event(s, "response.output_item.added",
               json_pack("{s:I,s:{s:s,s:s,s:s,s:s,s:s,s:s}}", "output_index", resp_index(s),
                         "item", "id", rs->call_item_id, "type", "function_call", "status",
                         "in_progress", "call_id", rs->call_id, "name", p->call.name,
                         "arguments", ""));
}

static void resp_call_args(api_stream *s, const char *args)
{
    resp_event(s, "response.function_call_arguments.delta",
               json_pack("{s:s,s:I,s:s}", "item_id", s->rs.call_item_id, "output_index",
                         resp_index(s), "delta", args));
}

/* A whole call (after its OUT_CALL_OPEN and OUT_CALL_ARGS pieces when call.streamed): the
 * arguments not yet sent, the .done events, the item. */
static void resp_call(api_stream *s, const out_piece *p)
{
    resp_state *rs = &s->rs;
    if (!p->call.streamed)
        resp_call_open(s, p);
    if (p->call.arguments[p->call.streamed])
        resp_call_args(s, p->call.arguments + p->call.streamed);
    const json_int_t at = resp_index(s);
    resp_event(s, "response.function_call_arguments.done",
               json_pack("{s:s,s:I,s:s,s:s}", "item_id", rs->call_item_id, "output_index", at,
                         "name", p->call.name, "arguments", p->call.arguments));
    json_t *item = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", rs->call_item_id, "type",
                             "function_call", "status", "completed", "call_id", rs->call_id,
                             "name", p->call.name, "arguments", p->call.arguments);
    resp_event(s, "response.output_item.done",
               json_pack("{s:I,s:O}", "output_index", at, "item", item));
    if (!item || json_array_append_new(rs->items, item) != 0)
        gen_oom(s);
}

void resp_piece(api_stream *s, const out_piece *p, json_t *lp)
{
    resp_state *rs = &s->rs;
    if (p->kind == OUT_TOOL_CALL || p->kind == OUT_CALL_OPEN || p->kind == OUT_CALL_ARGS) {
        json_decref(lp);
        resp_close(s, "completed");
        if (p->kind == OUT_CALL_OPEN)
            resp_call_open(s, p);
        else if (p->kind == OUT_CALL_ARGS)
            resp_call_args(s, p->text);
        else
            resp_call(s, p);
        return;
    }
    if (rs->open != p->kind) {
        resp_close(s, "completed");
        resp_open(s, p->kind);
    }
    if (!tbuf_put(&rs->text, p->text, p->len))
        gen_oom(s);
    if (p->kind == OUT_REASONING) {
        json_decref(lp);
        resp_event(s, "response.reasoning_text.delta",
                   json_pack("{s:s,s:I,s:i,s:s%}", "item_id", rs->item_id, "output_index",
                             resp_index(s), "content_index", 0, "delta", p->text, p->len));
        return;
    }
    if (lp) {
        if (!rs->lp)
            rs->lp = json_array();
        if (!rs->lp || json_array_extend(rs->lp, lp) != 0)
            gen_oom(s);
    }
    resp_event(s, "response.output_text.delta",
               json_pack("{s:s,s:I,s:i,s:s%,s:o}", "item_id", rs->item_id, "output_index",
                         resp_index(s), "content_index", 0, "delta", p->text, p->len,
                         "logprobs", lp ? lp : json_array()));
}

/* The status of a response that ended with finish (not failed). */
static const char *resp_status(const api_stream *s, const char *finish)
{
    return s->cancelled                                  ? "cancelled"
           : finish && strcmp(finish, "length") == 0 ? "incomplete"
                                                         : "completed";
}

/* One input item as input_items lists it (NULL when out of memory): the client's item with
 * its type, an id (the client's, else a new one), a status (but a reasoning item's) and a
 * message's content as parts. */
static json_t *resp_input_item(const json_t *given)
{
    json_t *it = json_deep_copy(given);
    const json_t *type = it ? json_object_get(it, "type") : NULL;
    const char *t = json_is_string(type) ? json_string_value(type) : "message";
    const bool message = strcmp(t, "message") == 0, reasoning = strcmp(t, "reasoning") == 0;
    const char *prefix = message ? "msg_" : !strcmp(t, "function_call") ? "fc_"
                         : reasoning ? "rs_" : "fco_";
    if (!it ||
        (!json_is_string(type) && json_object_set_new(it, "type", json_string("message")) != 0))
        goto oom;
    if (!json_is_string(json_object_get(it, "id"))) {
        char id[48];
        resp_new_id(id, sizeof id, prefix);
        if (json_object_set_new(it, "id", json_string(id)) != 0)
            goto oom;
    }
    if (!reasoning && !json_object_get(it, "status") &&
        json_object_set_new(it, "status", json_string("completed")) != 0)
        goto oom;
    const json_t *content = json_object_get(it, "content");
    if (message && json_is_string(content)) {
        const json_t *role = json_object_get(it, "role");
        json_t *part = strcmp(json_string_value(role), "assistant") == 0
                           ? json_pack("{s:s,s:O,s:[]}", "type", "output_text", "text", content,
                                       "annotations")
                           : json_pack("{s:s,s:O}", "type", "input_text", "text", content);
        if (json_object_set_new(it, "content", json_pack("[o]", part)) != 0)
            goto oom;
    }
    return it;
oom:
    json_decref(it);
    return NULL;
}

/* The request's input as input items (NULL when out of memory); a string is a user message. */
static json_t *resp_input_items(const api_stream *s)
{
    const json_t *input = json_object_get(s->req.resp, "input");
    json_t *wrapped = json_is_string(input) ? json_pack("[{s:s,s:s,s:O}]", "type", "message",
                                                        "role", "user", "content", input)
                                            : NULL;
    if (json_is_string(input) && !wrapped)
        return NULL;
    json_t *items = json_array();
    size_t i;
    const json_t *it;
    json_array_foreach(wrapped ? wrapped : input, i, it) {
        if (items && json_array_append_new(items, resp_input_item(it)) != 0) {
            json_decref(items);
            items = NULL;
        }
    }
    json_decref(wrapped);
    return items;
}

/* The finished response object (NULL when out of memory), kept with its conversation (the
 * request's, then its own output) and its input items when the request asked for that. */
static json_t *resp_final(api_stream *s, const char *status)
{
    json_t *o = resp_object(s, status);
    if (!o || !s->req.resp_keep)
        return o;
    json_t *conv = json_deep_copy(s->req.resp_conv), *input = resp_input_items(s);
    api_error e;
    if (!conv || !input || req_responses_items(conv, s->rs.items, &e) != TD_OK ||
        !rstore_put(s->g->responses, s->id, o, conv, input))
        LOG_WARN("response %s was not kept (out of memory, or larger than --responses-mem)",
                 s->id);
    json_decref(conv);
    json_decref(input);
    return o;
}

void resp_end(api_stream *s, const char *finish)
{
    const char *status = resp_status(s, finish);
    resp_close(s, s->cancelled ? "incomplete" : status);
    if (s->failed || !s->stream) /* a whole reply is made (and kept) by resp_body */
        return;
    if (s->cancelled) { /* kept; its stream ends with the items closed */
        json_decref(resp_final(s, status));
        return;
    }
    char type[32];
    snprintf(type, sizeof type, "response.%s", status);
    resp_event(s, type, json_pack("{s:o}", "response", resp_final(s, status)));
}

void resp_failed(api_stream *s)
{
    resp_event(s, "error", json_pack("{s:s,s:s,s:s?}", "code",
                                     s->err.code ? s->err.code : "server_error", "message",
                                     s->err.message, "param",
                                     s->err.param[0] ? s->err.param : NULL));
    resp_event(s, "response.failed", json_pack("{s:o}", "response",
                                               resp_object(s, "failed")));
}

void resp_queued(api_stream *s)
{
    resp_event(s, "response.created", json_pack("{s:o}", "response", resp_object(s, "queued")));
    resp_event(s, "response.queued", json_pack("{s:o}", "response", resp_object(s, "queued")));
}

void resp_started(api_stream *s)
{
    s->rs.started = true;
    resp_event(s, "response.in_progress", json_pack("{s:o}", "response",
                                                    resp_object(s, "in_progress")));
}

/* The status of s as it stands. */
static const char *resp_status_now(const api_stream *s)
{
    if (!s->done)
        return s->rs.started ? "in_progress" : "queued";
    return s->failed ? "failed" : resp_status(s, s->finish);
}

json_t *resp_now(api_stream *s)
{
    return resp_object(s, resp_status_now(s));
}

json_t *resp_ended(api_stream *s)
{
    const char *status = resp_status_now(s);
    if (s->failed || (s->cancelled && !s->rs.started))
        return resp_final(s, status);
    return resp_object(s, status);
}

char *resp_body(api_stream *s, const char *finish)
{
    json_t *o = resp_final(s, resp_status(s, finish));
    char *body = o ? render_dump(o) : NULL;
    json_decref(o);
    return body;
}

void resp_free(resp_state *rs)
{
    json_decref(rs->items);
    json_decref(rs->lp);
    free(rs->text.p);
    memset(rs, 0, sizeof *rs);
}
